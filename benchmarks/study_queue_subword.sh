#!/usr/bin/env bash
# The study's fourth round, the main table of an attention paper at a CPU size: subword language models
# pretrained on raw Wikipedia text (experiment=wikipedia_lm_cpu: a byte-level BPE of 8,192, windows of 256
# tokens, 4 layers of width 128, 2,000 steps of 16 windows, 8.2 M tokens), reported as perplexity, bits per
# byte and loss by position on held-out documents, then scored zero-shot with lm-evaluation-harness
# (LAMBADA, PIQA, HellaSwag, BoolQ from ../shared/data) at the end of training; 3 seeds per scheme, so that
# nas-report gives each difference a verdict over seeds. Schemes: softmax (unas), the seed paper's DNAS,
# differential attention and forgetting attention (without positions, as its paper trains it).
# One sweep after another, STUDY_JOBS one-thread jobs at a time (default 1); every sweep resumes, so run
# this script again after any stop. Run from the repository root with nas-run and its [eval] extra
# installed from a wheel into an environment of its own (PATH=<env>/bin:$PATH).
set -u
export OMP_NUM_THREADS=1
COMMON=(seed=1,2,3 hydra/launcher=joblib hydra.launcher.n_jobs=${STUDY_JOBS:-1} progress_bar=false threads=1
        experiment=wikipedia_lm_cpu task.path=../shared/data/wikipedia_en
        "lm_eval.tasks=[lambada_openai,piqa,hellaswag,boolq]" lm_eval.data_dir=../shared/data)
sweep() { echo "== $(date -u +%FT%TZ) $*"; nas-run -m "$@" "${COMMON[@]}" || echo "== sweep exited $?"; }
sweep attention=unas,dnas,differential hydra.sweep.dir=benchmarks/study/subword_lm_rope
sweep attention=forgetting model.positions=none hydra.sweep.dir=benchmarks/study/subword_lm_none
echo "== $(date -u +%FT%TZ) queue done"
