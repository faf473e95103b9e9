#!/usr/bin/env bash
# The study's fidelity round: MQAR at Zoology's Figure 2 settings (experiment=zoology_fig2) at a CPU size,
# beside the third round's mqar_cpu cells, and selective copying in its published forms (docs/study.md,
# "MQAR at Zoology's Figure 2 settings"). One sweep after another, STUDY_JOBS one-thread jobs at a time (default 2);
# every sweep resumes, so run this script again after any stop. Run from the repository root with nas-run
# installed from a wheel into an environment of its own (PATH=<env>/bin:$PATH).
# The CPU size, stated wherever it is reported: 20,000 training sequences and 1,500 steps of Figure 2's
# batch (512 at 64 and 128 tokens): 768,000 sequences seen, an eighth of Figure 2's 64 epochs of 100,000.
# Each width runs its four rates (np.logspace(-4, -2, 4)) for 3 seeds; nas-report chooses each cell's
# rate by validation query accuracy (tune: [optim.lr] of the preset).
set -u
export OMP_NUM_THREADS=1
COMMON=(seed=1,2,3 hydra/launcher=joblib hydra.launcher.n_jobs=${STUDY_JOBS:-2} progress_bar=false)
sweep() { echo "== $(date -u +%FT%TZ) $*"; nas-run -m "$@" "${COMMON[@]}" || echo "== sweep exited $?"; }
CPU_SIZE=(task.train_size=20000 trainer.max_epochs=-1 trainer.max_steps=1500 trainer.val_check_interval=250
          trainer.check_val_every_n_epoch=null)
zoology() {  # seq_len: each width's four rates and three seeds
    sweep experiment=zoology_fig2 task.seq_len=$1 "${CPU_SIZE[@]}" model.d_model=64,128 \
        optim.lr=1e-4,4.64e-4,2.15e-3,1e-2 hydra.sweep.dir=benchmarks/study/zoology$1
}
zoology 64
zoology 128
# selective copying in both published forms (docs/tasks.md): 256 inputs, 16 tokens to copy, vocabulary 16,
# the tiny model (2 layers, d_model 64, 4 heads), 2,000 steps of 64 sequences
copying() {  # variant
    sweep task=selective_copy task.variant=$1 model.positions=rope trainer.max_steps=2000 trainer.max_epochs=-1 \
        trainer.val_check_interval=250 trainer.check_val_every_n_epoch=null optim.lr=3e-3 \
        attention=unas,dnas,differential,selective hydra.sweep.dir=benchmarks/study/selective_copy_$1
}
copying mamba
copying mad
echo "== $(date -u +%FT%TZ) queue done"
