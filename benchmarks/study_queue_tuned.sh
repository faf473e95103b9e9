#!/usr/bin/env bash
# The study's Multi30k comparison retuned (docs/study.md, "Each scheme at its own learning rate"): UNAS,
# DNAS, HNAS and CODA at learning rates 1e-3 and 4e-3, beside the shared-rate sweep at 2e-3
# (benchmarks/study/multi30k), so that each scheme chooses its own rate from 1e-3, 2e-3 and 4e-3 by
# validation BLEU, on the verdict seeds (same-seed selection, the calibrated default). The sweep resumes:
# run this script again after any stop. Run from the repository root with nas-run installed from a wheel
# into an environment of its own (PATH=<env>/bin:$PATH); STUDY_JOBS jobs at a time (default 2).
set -u
export OMP_NUM_THREADS=1
echo "== $(date -u +%FT%TZ) multi30k retuned"
nas-run -m experiment=study_multi30k task.path=../shared/data/multi30k/raw seed=1,2,3 \
    attention=unas,dnas,hnas,coda optim.lr=1e-3,4e-3 'tune=[optim.lr]' \
    hydra/launcher=joblib hydra.launcher.n_jobs=${STUDY_JOBS:-2} progress_bar=false \
    hydra.sweep.dir=benchmarks/study/multi30k_tuned || echo "== sweep exited $?"
echo "== $(date -u +%FT%TZ) queue done"
# The comparison: nas-report benchmarks/study/multi30k benchmarks/study/multi30k_tuned --baseline scheme=unas --tune optim.lr
