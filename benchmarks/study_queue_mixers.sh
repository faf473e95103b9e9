#!/usr/bin/env bash
# The study's mixers: linear attention, GLA, DeltaNet, Gated DeltaNet and Mamba-2 on the third round's MQAR cells
# (experiment=mqar_cpu at seq_len 64 with 4 pairs and 128 with 8, d_model 64 and 128, 3 seeds), beside its attention
# schemes, for the page's MQAR table and its figure of query accuracy against state size (docs/study.md). The
# mixers run as their papers' layers do: a short causal convolution of 4 (attention.conv=4) and no positions
# (model.positions=none). One sweep after another, STUDY_JOBS one-thread jobs at a time (default 2); every sweep
# resumes, so run this script again after any stop. Run from the repository root with nas-run installed from a
# wheel into an environment of its own (PATH=<env>/bin:$PATH).
set -u
export OMP_NUM_THREADS=1
COMMON=(seed=1,2,3 hydra/launcher=joblib hydra.launcher.n_jobs=${STUDY_JOBS:-2} progress_bar=false)
MIXERS=attention=linear_attention,gla,deltanet,gated_deltanet,mamba2
sweep() { echo "== $(date -u +%FT%TZ) $*"; nas-run -m "$@" "${COMMON[@]}" || echo "== sweep exited $?"; }
mixers() {  # seq_len, pairs
    sweep experiment=mqar_cpu task.seq_len=$1 task.num_kv_pairs=$2 model.d_model=64,128 $MIXERS attention.conv=4 \
        model.positions=none hydra.sweep.dir=benchmarks/study/mqar$1_mixers
}
mixers 64 4
mixers 128 8
echo "== $(date -u +%FT%TZ) queue done"
