#!/usr/bin/env bash
# The study's sweeps, one after another, two one-thread jobs at a time. Every sweep resumes:
# run this script again after any stop and finished runs are skipped. Run from the repository
# root. Run it with nas-run installed from a wheel into an environment of its own
# (PATH=<env>/bin:$PATH), so that edits to the checkout cannot change a sweep midway. Order: WikiText-2 at n = 3, the heads axis, Sinkhorn,
# Zheng et al.'s schemes, Tsai et al.'s kernels, one- vs two-layer additive cross-attention.
set -u
M30K=(experiment=study_multi30k task.path=../shared/data/multi30k/raw seed=1,2,3
      hydra/launcher=joblib hydra.launcher.n_jobs=2 progress_bar=false)
export OMP_NUM_THREADS=1
sweep() { echo "== $(date -u +%FT%TZ) $*"; nas-run -m "$@" || echo "== sweep exited $?"; }
sweep experiment=wikitext2_cpu task.path=../shared/data/wikitext-2 seed=1,2,3 attention=unas,dnas \
    trainer.max_time=null trainer.max_steps=1719 trainer.deterministic=true \
    hydra.sweep.dir=benchmarks/study/wikitext2 hydra/launcher=joblib hydra.launcher.n_jobs=2 progress_bar=false
sweep "${M30K[@]}" attention=unas,coda model.heads=8,16,32 hydra.sweep.dir=benchmarks/study/multi30k_heads
sweep "${M30K[@]}" attention=sinkhorn hydra.sweep.dir=benchmarks/study/multi30k_sinkhorn
sweep "${M30K[@]}" attention=coda_cs,realformer hydra.sweep.dir=benchmarks/study/multi30k_zheng
sweep "${M30K[@]}" attention=kernel_rbf,kernel_poly,kernel_linear hydra.sweep.dir=benchmarks/study/multi30k_tsai
sweep "${M30K[@]}" attention=unas attention.cross=additive,additive_1layer hydra.sweep.dir=benchmarks/study/multi30k_additive
echo "== $(date -u +%FT%TZ) queue done"
