#!/usr/bin/env bash
# Every GPU check and measurement of docs/speed.md in one command, on a CUDA machine with
# nas-run installed:
#
#     benchmarks/gpu_measure.sh OUT_DIR [SECONDS_PER_STEP_SCALE]
#
# 1. correctness, not timed: `nas-bench gpu-check`'s numerics and its training cases at once
#    (they share the GPU);
# 2. timings, one at a time on an otherwise idle GPU: the attention core of the encoder form
#    (FlexAttention) and of the decoder's prefix form (Triton kernels) against SDPA, then
#    end-to-end training steps of Transformer-base at WMT14 shapes (bf16-mixed).
#
# Environment: ONLY_TRITON=1 stops after the Triton kernels' checks and timings and the Hugging Face
# step (step 0b: 10 minutes at most, for a GPU machine that allows one command 10 minutes, or 15 minutes with its start); LONG=1 adds the 64k-context
# memory check (100 s at most) and the encoder kernels' EVEN gain (S = 4096 against 4095, 60 s; SKIP_HF=1 leaves out the Hugging Face step to make room); MULTI30K=<folder> also trains the study's Multi30k preset on the GPU beside the
# checks; SKIP_NUMERICS=1 / SKIP_ATTENTION=1 leave out gpu-check's numerics / the attention-core
# timings (e.g. when only the training path changed since they were measured).
#
# Each step writes its own JSON and text into OUT_DIR as it ends and is stopped by `timeout`
# if it runs long, so a run cut short keeps what finished. Exit status: the number of steps
# that failed or timed out.
# tests/bench/test_gpu_measure_script.py runs this script on the CPU with a stand-in for every program it
# starts and puts each command line through that program's own checks (options, scheme and form names,
# nas-run's overrides), so that an edit here cannot cost a GPU run a misspelled option.
set -u
out=${1:?usage: benchmarks/gpu_measure.sh OUT_DIR [SECONDS_PER_STEP_SCALE]}
scale=${2:-1}
if ! nvidia-smi -L > /dev/null 2>&1; then  # before anything is made: every step needs the GPU
    echo "gpu_measure.sh: no NVIDIA GPU on this machine (nvidia-smi -L failed); nothing was run: run it on a CUDA machine" >&2
    exit 2
fi
mkdir -p "$out"
step() {  # step NAME SECONDS command...
    local name=$1 secs=$2
    shift 2
    local t0=$SECONDS
    timeout --kill-after=10 "$(( secs * scale ))" "$@" > "$out/$name.txt" 2>&1
    local rc=$?
    echo "$name: exit $rc after $(( SECONDS - t0 )) s" | tee -a "$out/steps.txt"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} > "$out/machine.txt" 2>&1

# 0. optional, beside the correctness checks: the study's Multi30k preset on this GPU (UNAS and
#    DNAS, seeds 1-3, bf16-mixed, six runs at once), to set beside the CPU study's BLEU
#    (MULTI30K=<the folder of train.de, ...>; left out when unset)
if [ -n "${MULTI30K:-}" ]; then
    step multi30k_gpu 330 nas-run -m experiment=study_multi30k trainer=gpu trainer.deterministic=warn logger=csv \
        task.path="$MULTI30K" seed=1,2,3 attention=unas,dnas hydra/launcher=joblib hydra.launcher.n_jobs=6 \
        progress_bar=false hydra.sweep.dir="$out/multi30k_gpu" &
fi
# 0b. the Triton kernels of both forms: values, gradients and determinism in float32, bf16
#     (tensor cores) and fp16 against float64 and SDPA's own error; then their time against SDPA, both
#     forms, d_head 64 and 128, S up to 16k; and the Llama-style training step through Hugging Face
#     The kernels compile (and their tiles are tuned) at the first call of each case, one compilation
#     after another in one process. So first, in parallel: each form's checks in a process of its own,
#     and beside them each timed scheme's smallest case (S=1024: every integer argument the kernels
#     specialize on, such as S and the blocks per chunk, is then a multiple of 16, as at the timed
#     lengths), so that the compilations share the CPU cores and land in Triton's on-disk cache for the
#     timing steps. SKIP_WARM=1 leaves the warm-up cases out.
mkdir -p "$out/warm"
for form in encoder hnas-encoder sinkhorn3-encoder prefix hnas-prefix; do
    step "triton_check_$form" 200 python benchmarks/triton_check.py --forms "$form" --out "$out/triton_check_$form.json" &
done
if [ "${SKIP_WARM:-0}" != 1 ]; then
    warm() {  # warm NAME nas-bench-attention-arguments...
        local name=$1
        shift
        timeout --kill-after=10 "$(( 200 * scale ))" nas-bench attention --device cuda --dtype bfloat16 --lengths 1024 \
            --repeats 1 --warmup 1 --max-seconds 600 "$@" --out-json "$out/warm/$name.json" \
            --out-md "$out/warm/$name.md" > "$out/warm/$name.txt" 2>&1
        echo "warm $name: exit $? after $SECONDS s" >> "$out/warm/steps.txt"
    }
    for scheme in dnas-triton hnas-triton sinkhorn-triton; do
        warm "encoder_$scheme" --batch 8 --heads 8 --d-head 64 --causal off --schemes "$scheme" &
    done
    for scheme in dnas-triton hnas-triton; do
        warm "prefix_$scheme" --batch 8 --heads 8 --d-head 64 --causal on --schemes "$scheme" &
    done
    warm d128_dnas-triton --batch 4 --heads 8 --d-head 128 --causal both --schemes dnas-triton &
    # LONG=1's EVEN comparison below: the encoder kernels with the bounds test, compiled at a length the
    # tiles do not divide (the later --lengths wins; 1023 and 4095 specialize alike, neither a multiple of 16)
    [ "${LONG:-0}" = 1 ] && warm encoder_dnas-triton_uneven --batch 8 --heads 8 --d-head 64 --causal off \
        --schemes dnas-triton --lengths 1023 &
fi
wait
# the encoder kernels' tiles are autotuned on the GPU (nas_cli/attention/triton_tiles.py): if the check of the
# autotuned rows failed, the timings run with the fixed tiles instead (and say so in steps.txt)
if cat "$out"/triton_check_*.txt 2>/dev/null | grep -q '"tiles": "auto".*"pass": false'; then
    export NAS_TRITON_TILES=fixed
    echo "autotuned tiles failed their check: timings with NAS_TRITON_TILES=fixed" | tee -a "$out/steps.txt"
fi
step attention_triton_encoder 130 nas-bench attention --device cuda --dtype bfloat16 --batch 8 --heads 8 --d-head 64 \
    --causal off --lengths 1024,2048,4096,8192,16384 --schemes unas,dnas-triton,hnas-triton,sinkhorn-triton,dnas-flex --max-seconds 150 \
    --out-json "$out/attention_triton_encoder.json" --out-md "$out/attention_triton_encoder.md"
step attention_triton_prefix 110 nas-bench attention --device cuda --dtype bfloat16 --batch 8 --heads 8 --d-head 64 \
    --causal on --lengths 1024,2048,4096,8192,16384 --schemes unas,dnas-triton,hnas-triton --max-seconds 150 \
    --out-json "$out/attention_triton_prefix.json" --out-md "$out/attention_triton_prefix.md"
step attention_triton_d128 60 nas-bench attention --device cuda --dtype bfloat16 --batch 4 --heads 8 --d-head 128 \
    --causal both --lengths 2048,8192 --schemes unas,dnas-triton --max-seconds 150 \
    --out-json "$out/attention_triton_d128.json" --out-md "$out/attention_triton_d128.md"
[ "${SKIP_HF:-0}" = 1 ] || step hf_step 100 python benchmarks/hf_step.py --device cuda --layers 8 --hidden 512 --heads 8 --seq 2048 --batch 4 \
    --bf16 --reps 10 --warmup 3 --tag "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
    --out "$out/hf_step.json" --markdown "$out/hf_step.md"
# LONG=1: the longest context one DNAS layer trains at (B=1, H=8, d=64, S up to 64k;
# nas-bench attention records each case's peak memory, which must grow linearly in S), instead of hf_step
# when one run's time cannot hold both
if [ "${LONG:-0}" = 1 ]; then
    step attention_long 100 nas-bench attention --device cuda --dtype bfloat16 --batch 1 --heads 8 --d-head 64 \
        --causal both --lengths 16384,32768,65536 --schemes unas,dnas-triton --repeats 2 \
        --out-json "$out/attention_long.json" --out-md "$out/attention_long.md"
    # what skipping the bounds test gains (the encoder kernels' EVEN case, where the tiles divide both
    # lengths): S = 4096 against 4095, one row shorter but tested at every tile, in one run
    step attention_triton_even 60 nas-bench attention --device cuda --dtype bfloat16 --batch 8 --heads 8 --d-head 64 \
        --causal off --lengths 4095,4096 --schemes unas,dnas-triton --max-seconds 60 \
        --out-json "$out/attention_triton_even.json" --out-md "$out/attention_triton_even.md"
fi
[ "${ONLY_TRITON:-0}" = 1 ] && exit "$(grep -vc ': exit 0 ' "$out/steps.txt")"

# 1. correctness (numerics in one process, the training cases eight at a time beside it)
step gpu_check_training 240 nas-bench gpu-check --only training --jobs 8 --out-json "$out/gpu_check_training.json" &
# shellcheck disable=SC2086  # GPU_CHECK_ARGS: e.g. "--schemes dnas-flex,dnas-triton" to recheck some schemes
[ "${SKIP_NUMERICS:-0}" = 1 ] || step gpu_check_numerics 240 nas-bench gpu-check --only numerics \
    --out-json "$out/gpu_check_numerics.json" ${GPU_CHECK_ARGS:-}
wait

# 2. timings (SKIP_ATTENTION=1: only the end-to-end one)
[ "${SKIP_ATTENTION:-0}" = 1 ] || step attention_prefix 80 nas-bench attention --device cuda --dtype bfloat16 --batch 8 --heads 8 --d-head 64 \
    --causal on --lengths 512,1024,2048,4096,8192 --schemes unas,dnas-triton,hnas-triton,dnas \
    --out-json "$out/attention_prefix.json" --out-md "$out/attention_prefix.md"
[ "${SKIP_ATTENTION:-0}" = 1 ] || step attention_encoder 170 nas-bench attention --device cuda --dtype bfloat16 --batch 8 --heads 8 --d-head 64 \
    --causal off --lengths 512,1024,2048,4096,8192,16384 --schemes unas,dnas-flex,hnas-flex,sinkhorn-flex,dnas \
    --out-json "$out/attention_encoder.json" --out-md "$out/attention_encoder.md"
step train_base 200 nas-bench train --model base --src-len 128 --batch 32 --device cuda --precision bf16-mixed \
    --steps 10 --repeats 5 --schemes unas,dnas@encoder,dnas-flex@encoder,dnas,dnas-efficient,dnas-triton \
    --out-json "$out/train_base.json" --out-md "$out/train_base.md"
exit "$(grep -vc ': exit 0 ' "$out/steps.txt")"
