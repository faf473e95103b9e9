#!/usr/bin/env bash
# The study's Multi30k preset trained longer on a GPU (3,000 updates, about 20 epochs, bf16-mixed),
# on a CUDA machine with nas-run installed:
#
#     benchmarks/gpu_multi30k_3000.sh OUT_DIR MULTI30K_DIR [SECONDS]
#
# DNAS x seeds 1-3 (three jobs sharing the GPU) and, beside them, UNAS seed 1, which checks that
# earlier UNAS runs of the same preset on the same kind of machine reproduce (so that they can be
# paired with these DNAS runs by seed). Each sweep trains under /tmp and stops after SECONDS
# (default 430; a stopped job saves last.ckpt, and the same command resumes it); OUT_DIR gets each
# run's summary.json, test_items.json, nas_run.log and diagnostics, never checkpoints. Compare with
# `nas-report <UNAS runs> OUT_DIR/multi30k_3000_dnas --baseline scheme=unas --metrics bleu,ppl`.
set -u
out=${1:?usage: benchmarks/gpu_multi30k_3000.sh OUT_DIR MULTI30K_DIR [SECONDS]}
data=$(realpath "${2:?usage: benchmarks/gpu_multi30k_3000.sh OUT_DIR MULTI30K_DIR [SECONDS]}")
limit=${3:-430}
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} > "$out/machine.txt" 2>&1
common=(experiment=study_multi30k trainer=gpu trainer.deterministic=warn logger=csv task.path="$data"
        trainer.max_steps=3000 trainer.val_check_interval=1000 hydra/launcher=joblib progress_bar=false)
t0=$SECONDS
timeout --kill-after=20 "$limit" nas-run -m "${common[@]}" seed=1,2,3 attention=dnas hydra.launcher.n_jobs=3 \
    hydra.sweep.dir=/tmp/multi30k_3000_dnas > "$out/dnas_log.txt" 2>&1 &
timeout --kill-after=20 "$limit" nas-run -m "${common[@]}" seed=1 attention=unas hydra.launcher.n_jobs=1 \
    hydra.sweep.dir=/tmp/multi30k_3000_unas_seed1 > "$out/unas_log.txt" 2>&1 &
wait
echo "both sweeps ended after $(( SECONDS - t0 )) s" | tee "$out/steps.txt"
for sweep in /tmp/multi30k_3000_dnas /tmp/multi30k_3000_unas_seed1; do
    name=$(basename "$sweep")
    for run in "$sweep"/*/; do
        dest="$out/$name/$(basename "$run")"
        mkdir -p "$dest"
        for f in summary.json test_items.json nas_run.log failed.json diagnostics csv; do
            [ -e "$run/$f" ] && cp -r "$run/$f" "$dest/"
        done
    done
    cp "$sweep/multirun.yaml" "$out/$name/" 2>/dev/null
done
