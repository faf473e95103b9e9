#!/usr/bin/env bash
# The study's Llama-style row (docs/huggingface.md): UNAS vs causal DNAS with model=hf_llama on
# WikiText-2 at the study's conventions (wikitext2_cpu: its adaptive softmax, 1,719 updates,
# deterministic, seeds 1-3), two one-thread jobs at a time. Resumable like every sweep: run again
# after any stop. Run it from the repository root
# with nas-run (and the hf extra) installed from a wheel into an environment of its own
# (PATH=<env>/bin:$PATH), after benchmarks/study_queue.sh or while it is stopped.
set -u
export OMP_NUM_THREADS=1
echo "== $(date -u +%FT%TZ) wikitext2_hf_llama"
nas-run -m experiment=wikitext2_cpu task.path=../shared/data/wikitext-2 model=hf_llama \
    seed=1,2,3 attention=unas,dnas trainer.max_time=null trainer.max_steps=1719 trainer.deterministic=true \
    hydra.sweep.dir=benchmarks/study/wikitext2_hf_llama hydra/launcher=joblib hydra.launcher.n_jobs=2 \
    progress_bar=false || echo "== sweep exited $?"
echo "== $(date -u +%FT%TZ) done"
