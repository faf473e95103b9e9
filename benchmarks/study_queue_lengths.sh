#!/usr/bin/env bash
# The study's third round: today's baselines on MQAR and on WikiText-2 trained at 256 tokens and tested
# at 256 to 2,048 (docs/study.md, "Today's baselines"). One sweep after another, two one-thread jobs at
# a time; every sweep resumes, so run this script again after any stop. Run from the repository root
# with nas-run installed from a wheel into an environment of its own (PATH=<env>/bin:$PATH).
# Positions: the schemes with rotary positions (model.positions=rope); UNAS also with sinusoidal,
# ALiBi and no positions; forgetting and stick-breaking attention without positions, as their papers
# train them. Order: MQAR at seq_len 64, WikiText-2 (the extrapolation claim's schemes before UNAS's other
# positions), MQAR at seq_len 128. At seq_len 128 each scheme runs at both widths before the next scheme, so
# that UNAS with rotary positions (the MQAR claim's scheme) is decided first.
set -u
export OMP_NUM_THREADS=1
COMMON=(seed=1,2,3 hydra/launcher=joblib hydra.launcher.n_jobs=${STUDY_JOBS:-2} progress_bar=false)
ROPE=attention=unas,dnas,hnas,sigmoid,softpick,gated,differential,selective
sweep() { echo "== $(date -u +%FT%TZ) $*"; nas-run -m "$@" "${COMMON[@]}" || echo "== sweep exited $?"; }
mqar() {  # seq_len, pairs, widths-first or schemes-first (a sweep resumes only in the order it began in)
    local task=(experiment=mqar_cpu task.seq_len=$1 task.num_kv_pairs=$2) order=$3
    cell() { if [ "$order" = widths-first ]; then echo model.d_model=64,128 "$@"; else echo "$@" model.d_model=64,128; fi; }
    sweep "${task[@]}" $(cell $ROPE) hydra.sweep.dir=benchmarks/study/mqar$1_rope
    sweep "${task[@]}" $(cell attention=unas model.positions=sinusoidal,alibi,none) hydra.sweep.dir=benchmarks/study/mqar$1_unas
    sweep "${task[@]}" $(cell attention=forgetting,stickbreaking model.positions=none) hydra.sweep.dir=benchmarks/study/mqar$1_none
}
wikitext() {
    local cell=(experiment=wikitext2_lengths task.path=../shared/data/wikitext-2 trainer.deterministic=true)
    sweep "${cell[@]}" $ROPE hydra.sweep.dir=benchmarks/study/wikitext2_lengths_rope
    sweep "${cell[@]}" attention=forgetting,stickbreaking model.positions=none hydra.sweep.dir=benchmarks/study/wikitext2_lengths_none
    sweep "${cell[@]}" attention=unas model.positions=sinusoidal,alibi,none hydra.sweep.dir=benchmarks/study/wikitext2_lengths_unas
}
mqar 64 4 widths-first
wikitext
mqar 128 8 schemes-first
echo "== $(date -u +%FT%TZ) queue done"
