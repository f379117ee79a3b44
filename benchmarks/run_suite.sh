#!/usr/bin/env bash
# The GPU measurements behind benchmarks/RESULTS.md, from one entry point.
#
# Usage (on a CUDA machine, from the repository root, fusegen and its test extras installed):
#   bash benchmarks/run_suite.sh OUT                    # every step and every suite run
#   bash benchmarks/run_suite.sh OUT STEP_OR_RUN ...    # only these, in the order given
#   bash benchmarks/run_suite.sh --list                 # the steps and the runs
#
# A RUN is a run of benchmarks/suite.yaml (a `fusegen bench` table; `fusegen bench --suite
# benchmarks/suite.yaml --list` prints each with its command line): it writes
# OUT/RUN/bench.{json,md,png} and its output to OUT/RUN.txt.
# A STEP is a measurement that is not a `fusegen bench` table; each writes OUT/STEP.txt,
# which starts every command it runs with "+ ", as written here:
#   generated-tests    every generated test, the import-style tests and the attention
#                      launcher's (64-bit offsets) on the GPU; then the compile tests again
#                      with the opaque custom ops (FUSEGEN_TRITON_OP=0)
#   hopper-tests       the Gluon kernels' tests (fp8 block-scaled SwiGLU, attention's forward and
#                      backward) against float64, stopping at the first failure with its report
#   tune-tables        `fusegen tune` of the example specs' committed tables (rewrites
#                      generated/*.tuned.json; copies them to OUT/tune-tables/)
#   tuning-repeat      `fusegen tune` of gpt2_mlp_up at 4096 rows three times, into a fresh
#                      build: do three tunings pick configs within a few percent?
#   config-space       every config of the anchor GEMM chains at issue 3's shapes (`fusegen
#                      tune`'s per-config log): what a first-call shortlist and the untuned
#                      default must find
#   first-calls        a launcher's first call in a fresh process, empty Triton cache: the
#                      example kernels with their tables, without, and the anchor chains
#   row-layouts        row and elementwise kernels on strided inputs: read as they are, or
#                      copied first
#   launch-cost        the launchers' Python per call on the CPU (launch stubbed), and the
#                      example kernels' time per call on the GPU at 16 rows, direct launch
#                      and triton's dispatch
#   call-cost          issue 27's table: a launcher call against the PyTorch op it replaces
#                      (decode attention, gate/up, RMSNorm, fp32 and tiny chains), wall and
#                      GPU time in alternating rounds (benchmarks/specs/call_cost.yaml)
#   split-k            split-K configs of the decode matmuls: the float64 reference, and
#                      bitwise-identical output over 200 calls
#   inspect            registers, spills, shared memory of the chosen configs; L1/L2 hit
#                      rates and DRAM bandwidth of one launch (Nsight Compute)
#   tanh-approx        the GPU's tanh.approx.f32 against float64, over every fp32 in [2^-30, 16]
#   launcher-tuning    the launcher's own first-call tuning of gpt2_mlp_up (no table) at 7,
#                      16 and 4096 rows: what it picks and how long it takes
#   training-chains    forward + backward of the training chains (GEMM chains, norms, softmax)
#                      against eager, torch.compile and Liger-Kernel (pure Python: carry its
#                      wheel): GPU time over interleaved rounds, saved and peak memory
#   llama-training-step  a transformers LLaMA (2 layers, 8B dims) training step with the
#                      generated kernels swapped in: gradients vs float64, eager and compiled time
#                      in alternating rounds; then with every swap (attention, LM head loss too)
#   backward-configs   the backward kernels over a grid of launch configs (the runtime's defaults)
#   attention-zoo      the zoo's small attention specs (tests/test_kernels.py's ATTENTION_SPECS:
#                      fp32 calls, bias, ALiBi, MQA, window) built and their tests run on the GPU
#   attention-anchors  issue 16's attention cases: the generated kernels against SDPA's flash,
#                      cuDNN and efficient backends and compiled FlexAttention, forward and backward
#   attention-host     the short training steps (BERT's padding bias, T5's learned bias: 512
#                      tokens): each variant's host time per step against its wall time, and
#                      where the host time goes (attention_anchors.py --host)
#   attention-bias-grad  the bias rows' forward + backward with d bias (T5's learned bias,
#                      BERT's padding, a d-128 bias) against SDPA, Flex and the same module
#                      summing d bias over the batch in its dq kernel; then that sum at T5's
#                      head dim 64 (attention_variants.py: bias-sum, bias-sum-unrolled)
#   attention-configs  the attention kernels over a grid of launch configs (forward at each
#                      case, the backward's dk/dv and dq kernels): what attention_text.py's CONFIGS hold
#   attention-variants code variants of the attention kernels (benchmarks/experiments/
#                      attention_variants.py: heaviest blocks first, pointer loads, warp
#                      specialization, a lazy rescale), checked and timed before the
#                      generator takes one
#   quantized-chains   issue 31's table: the fp8, int8 and int4 chains of specs/quantized.yaml
#                      against torch._scaled_mm (row-wise, block-wise), tinygemm and bf16
#   fp8-block-scales   the block-scaled fp8 SwiGLU's code variants (one multiply-add a step,
#                      TMA loads) at explicit tiles, beside cuBLASLt's block-wise scaled_mm
#   fp8-block-gluon    the block-scaled fp8 SwiGLU as a Gluon kernel (each K step's wgmma
#                      retired before its scale multiply, consumer warpgroups overlapping),
#                      its variants checked against float64, beside the generated kernel and
#                      cuBLASLt's block-wise scaled_mm
#   attention-gluon-backward
#                      the Hopper (Gluon) backward: its tests against float64, its kernels
#                      alone beside the `tl` backward, and the causal and GQA forward +
#                      backward rows against cuDNN
#   attention-backward-d64
#                      the Gluon backward at head dim 64 (the runtime's since it beat the
#                      `tl` one here, 2026-12-07) against the `tl` one: d 64's causal and
#                      unmasked rows and LLaMA-3.2-1B's GQA 32/8 at 4096
#   attention-d64-profile
#                      Nsight Compute on issue 29's causal d 64 row (16 x 16 x 1024): one call
#                      of cuDNN's forward, the `tl` one and the Gluon ones (every grid), each
#                      kernel's tensor-pipe use, occupancy and warp stalls: what limits it
#   attention-persistent
#                      the runtime's Gluon forward on a persistent grid (forward's
#                      persistent, in two tile orders): its tests against float64, then
#                      issue 29's d 64 rows (causal, no mask, GQA 32/8) and d 128's causal
#                      and no mask against the grid of every tile, the `tl` kernel and cuDNN
#   fp8-expert-rows    the same rows at a DeepSeek-V3 expert's 2,048 columns (7168 -> 2048):
#                      where the Gluon kernel's tiles fill the SMs twice (HOPPER_MIN_WAVES)
#   fp8-block-runtime  the runtime's copy of that kernel (quant_hopper, from HOPPER_MIN_ROWS rows):
#                      its float64 tests, then by rows against the `tl` kernel and cuBLASLt
#                      (benchmarks/fp8_block_rows.py: what HOPPER_MIN_ROWS should be)
#   int8-decode-gluon  the int8 decode linear as a Gluon kernel (a TMA producer keeping the
#                      weights' loads in flight, the weights wgmma's register operand),
#                      its variants checked against float64, beside the generated kernel
#                      and bf16 F.linear
#   int4-decode-gluon  the int4 SwiGLU at decode as a Gluon kernel (the int8 one's
#                      structure; the packed bytes loaded as wgmma's register operand),
#                      at 16 rows and one, beside the generated kernel and the bf16 chain
#   int4-decode-runtime
#                      the runtime's copy of that kernel's words variant (int4_hopper, the
#                      default from 2 to 16 rows): its float64 tests and the generated
#                      module's, then by rows against the generated kernel and the bf16 chain,
#                      with its knobs' variants (benchmarks/int4_decode_rows.py: what
#                      HOPPER_INT4_MIN_ROWS and the knobs should be)
#   quant-decode-profile
#                      Nsight Compute on one call each of the quantized decode kernels as the
#                      runtime picks them (int4 SwiGLU at 1 row: the GEMV; at 16: the Gluon
#                      kernel; int8 at 16): memory workload, warp stalls, scheduler: what
#                      holds the Gluon int4 kernel at 1.7 TB/s
#   stream-ceiling     how fast one kernel streams 29-235 MB from memory (a Triton read over
#                      its launch settings, torch's copy and sum): the ceiling issue 31's
#                      decode rows are held to (benchmarks/experiments/stream_ceiling.py)
#   int4-gemv          the one-row int4 SwiGLU's words GEMV variants (loads pipelined by the
#                      loop, TMA, a byte's nibbles from one shift) against the generated kernel
#   attention-bench    `fusegen bench` and `fusegen inspect` of specs/fused_attention.yaml's
#                      kernels at a prefill and a decode shape, against SDPA and FlexAttention
#   llama-compiled     the same model's decode, prefill and training step, eager, compiled and
#                      reduce-overhead, with triton ops (the default) and the opaque ops (FUSEGEN_TRITON_OP=0)
#   llama-attention    the training step (gradients vs float64, time) and the compiled
#                      prefill and step with generated/llama3_attention swapped in as well
#                      (transformers' AttentionInterface); compiled again with every op
#                      opaque (FUSEGEN_TRITON_OP=0); its decode-sized forwards
#                      (llama_decode.py --attention), triton ops and opaque
#   llama-prefill      LLaMA prefills with only the attention swapped (SDPA, each backend
#                      forced, fusegen): LLaMA-3-8B at 1 x 16384, LLaMA-3.2-1B (head dim 64:
#                      the persistent grid, longest first) at 4 x 4096, and its training step
#   llama-decode       its decode-sized forwards, HF and fusegen in alternating rounds of one
#                      process, and the GPU's busy time per call; four processes, the op kinds
#                      alternating (triton ops, opaque, triton ops, opaque), then compiled
#                      with Inductor's static launch of user-defined kernels
# Settings: PYTHON (python3), TEST_WORKERS (8), STEP_TIMEOUT_S per command (1200).
# Exit status: 0 when every command exited 0, 1 otherwise, 2 for a wrong command line.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SUITE=benchmarks/suite.yaml
STEPS="generated-tests hopper-tests tune-tables tuning-repeat config-space first-calls row-layouts
launch-cost call-cost split-k inspect tanh-approx launcher-tuning training-chains llama-training-step
backward-configs llama-compiled llama-attention llama-prefill llama-decode attention-zoo attention-anchors attention-host attention-bias-grad attention-configs
attention-variants attention-gluon-backward attention-backward-d64 attention-persistent attention-d64-profile attention-bench quantized-chains fp8-block-scales
fp8-block-gluon fp8-block-runtime fp8-expert-rows int8-decode-gluon int4-decode-gluon int4-decode-runtime quant-decode-profile stream-ceiling int4-gemv"
ANCHOR_SHAPES="8192,4096,14336 4096,1024,4096 16,4096,14336 1000,1000,1000"

listing=$($PYTHON -m fusegen bench --suite "$SUITE" --list) || {
    echo "run_suite.sh: cannot read $SUITE (above)" >&2
    exit 2
}
runs=$(grep -v '^ ' <<<"$listing" | cut -d: -f1)
if [ "${1:-}" = "--list" ] || [ $# -eq 0 ]; then
    echo "steps:" $STEPS
    echo "runs of $SUITE:" $runs
    [ $# -eq 0 ] && echo "usage: bash benchmarks/run_suite.sh OUT [STEP_OR_RUN ...]" >&2
    exit $(($# == 0 ? 2 : 0))
fi
out=$1
shift
wanted=("$@")
[ ${#wanted[@]} -eq 0 ] && wanted=($STEPS $runs)
for name in "${wanted[@]}"; do
    if ! tr ' ' '\n' <<<"$STEPS $runs" | grep -qx -- "$name"; then
        echo "run_suite.sh: no step or run '$name'" >&2
        echo "steps: $(echo $STEPS)" >&2
        echo "runs of $SUITE: $(echo $runs)" >&2
        exit 2
    fi
done
mkdir -p "$out"
export PYTHONUNBUFFERED=1

failed=0
run() {  # run COMMAND...: print it to the step's log, then run it there
    echo "+ $*" >>"$log"
    timeout "${STEP_TIMEOUT_S:-1200}" "$@" >>"$log" 2>&1
    local status=$?
    echo "exit $status" >>"$log"
    [ $status -eq 0 ] || failed=1
}

for name in "${wanted[@]}"; do
    log="$out/$name.txt"
    : >"$log"
    echo "== $name -> $log" >&2
    case $name in
    generated-tests)
        run $PYTHON -m pytest generated tests/test_import_styles.py tests/test_attention.py -q \
            -p no:cacheprovider -n "${TEST_WORKERS:-8}"
        FUSEGEN_TRITON_OP=0 run $PYTHON -m pytest generated -q -p no:cacheprovider \
            -n "${TEST_WORKERS:-8}" -k "torch_compile or inductor or cuda_graphs" ;;
    hopper-tests)
        # Four at a time: one by one they take about 4.5 s each (compiles, float64 training).
        run $PYTHON -m pytest tests/test_quant_hopper.py tests/test_attention_hopper.py \
            tests/test_attention_hopper_backward.py -x -rf -q -p no:cacheprovider -n 4 ;;
    tune-tables)
        run $PYTHON -m fusegen tune specs/gpt2.yaml specs/llama.yaml specs/bert.yaml \
            --rows 16,64,256,1024,4096
        run $PYTHON -m fusegen tune specs/attention.yaml --shapes 16384,2048
        run $PYTHON -m fusegen tune specs/elementwise.yaml --shapes 16384,8192
        run $PYTHON -m fusegen tune specs/fused_attention.yaml \
            --attention-shapes 4,4096,4096 2,1024,1024 1,1,16384 16,1,4096 16,8,4096
        mkdir -p "$out/tune-tables"
        cp generated/*.tuned.json "$out/tune-tables/" ;;
    tuning-repeat)
        run $PYTHON -m fusegen build specs --out "$out/tuning-repeat"
        for _ in 1 2 3; do
            run $PYTHON -m fusegen tune specs --kernels gpt2_mlp_up --rows 4096 \
                --out "$out/tuning-repeat"
        done ;;
    config-space)
        run $PYTHON -m fusegen build benchmarks/specs --out "$out/config-space"
        run $PYTHON -m fusegen tune benchmarks/specs/anchors.yaml \
            --kernels anchor_gelu anchor_swiglu --shapes $ANCHOR_SHAPES --out "$out/config-space" ;;
    first-calls)
        run $PYTHON benchmarks/first_call.py --rows 16,4096
        run $PYTHON benchmarks/first_call.py --no-table --rows 16,4096
        run $PYTHON benchmarks/first_call.py --spec benchmarks/specs/anchors.yaml \
            --kernels anchor_gelu anchor_swiglu --shapes $ANCHOR_SHAPES ;;
    row-layouts)
        run $PYTHON benchmarks/row_layouts.py ;;
    launch-cost)
        run $PYTHON -m fusegen build benchmarks/specs/call_cost.yaml --out "$out/call_cost_build"
        run $PYTHON benchmarks/launch_overhead.py "$out/call_cost_build"
        run $PYTHON benchmarks/call_time.py
        run env FUSEGEN_DIRECT_LAUNCH=0 $PYTHON benchmarks/call_time.py ;;
    call-cost)
        run $PYTHON -m fusegen build benchmarks/specs/call_cost.yaml --out "$out/call_cost_build"
        run $PYTHON benchmarks/call_cost.py "$out/call_cost_build" --out "$out/call_cost.json" ;;
    split-k)
        run $PYTHON benchmarks/split_k_determinism.py ;;
    inspect)
        run $PYTHON -m fusegen inspect specs --kernels gpt2_mlp_up llama_mlp_gate_up --rows 16,4096
        run $PYTHON -m fusegen inspect specs --kernels gpt2_mlp_up --rows 4096 --counters ;;
    tanh-approx)
        run $PYTHON benchmarks/tanh_approx_error.py ;;
    launcher-tuning)
        run $PYTHON benchmarks/autotune_check.py ;;
    training-chains)
        run $PYTHON benchmarks/training_chains.py --out "$out/training_chains.json" ;;
    llama-training-step)
        run $PYTHON benchmarks/llama_training_step.py --out "$out/llama_step.json"
        run $PYTHON benchmarks/llama_training_step.py --all --out "$out/llama_step_all.json" ;;
    backward-configs)
        run $PYTHON benchmarks/backward_configs.py --out "$out/backward_configs.json" ;;
    attention-zoo)
        mkdir -p "$out/attention-zoo"
        run $PYTHON -c "import sys; sys.path.insert(0, 'tests'); import test_kernels as t; \
open('$out/attention-zoo/attention.yaml', 'w').write(t.ATTENTION_SPECS)"
        run $PYTHON -m fusegen build "$out/attention-zoo/attention.yaml" --out "$out/attention-zoo/gen"
        run $PYTHON -m pytest "$out/attention-zoo/gen" -q -p no:cacheprovider \
            --tb=short -n "${TEST_WORKERS:-8}" --durations=15 ;;
    attention-anchors)
        run $PYTHON benchmarks/attention_anchors.py --rounds 5 --out "$out/attention_anchors.json" ;;
    attention-host)
        run $PYTHON benchmarks/attention_anchors.py --cases padding-bias-backward \
            learned-bias-backward --host --rounds 5 ;;
    attention-bias-grad)
        run $PYTHON benchmarks/attention_anchors.py --cases learned-bias-backward \
            padding-bias-backward bias-backward --anchors sdpa flex summed --rounds 5
        run $PYTHON benchmarks/experiments/attention_variants.py --cases learned-bias-backward \
            --rounds 5 ;;
    attention-configs)
        run $PYTHON benchmarks/attention_configs.py --out "$out/attention_configs.json" ;;
    attention-variants)
        run $PYTHON benchmarks/experiments/attention_variants.py --out "$out/attention_variants.json" ;;
    attention-gluon-backward)
        run $PYTHON -m pytest tests/test_attention_hopper_backward.py -q -p no:cacheprovider
        run $PYTHON -m fusegen build benchmarks/specs/attention_anchors.yaml \
            --out "$out/attention-anchors-build"
        run $PYTHON benchmarks/experiments/attention_gluon_backward.py \
            --built "$out/attention-anchors-build" --cases causal full
        run $PYTHON benchmarks/attention_anchors.py --built "$out/attention-anchors-build" \
            --cases causal-backward gqa-backward --anchors sdpa \
            --out "$out/attention_gluon_backward.json" ;;
    attention-backward-d64)
        build="$out/attention-backward-d64-build"
        run $PYTHON -m fusegen build benchmarks/specs/attention_anchors.yaml --out "$build"
        for case in causal full; do
            run $PYTHON benchmarks/experiments/attention_gluon_backward.py --built "$build" \
                --shape 16 16 1024 64 --cases $case --module anchor_attention_${case}_d64
        done
        run $PYTHON benchmarks/experiments/attention_gluon_backward.py --built "$build" \
            --shape 4 32 4096 64 --kv-heads 8 --cases causal --module anchor_attention_gqa_d64 ;;
    attention-persistent)
        run $PYTHON -m pytest tests/test_attention_hopper.py -q -p no:cacheprovider -k persistent
        run $PYTHON -m fusegen build benchmarks/specs/attention_anchors.yaml \
            --out "$out/attention-persistent-build"
        for shape in "16 16 1024 64" "4 32 4096 128"; do
            run $PYTHON benchmarks/experiments/attention_gluon_hopper.py --variants \
                --built "$out/attention-persistent-build" --shape $shape --cases causal full
        done
        run $PYTHON benchmarks/experiments/attention_gluon_hopper.py --variants \
            --built "$out/attention-persistent-build" --shape 4 32 4096 64 --kv-heads 8 \
            --cases causal ;;
    attention-d64-profile)
        run $PYTHON -m fusegen build benchmarks/specs/attention_anchors.yaml \
            --out "$out/attention-d64-profile-build"
        run ncu --profile-from-start off --clock-control none --section SpeedOfLight \
            --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
            --section WarpStateStats $PYTHON benchmarks/experiments/attention_gluon_hopper.py \
            --profile --variants --built "$out/attention-d64-profile-build" \
            --shape 16 16 1024 64 --cases causal ;;
    attention-bench)
        run $PYTHON -m fusegen bench specs/fused_attention.yaml --attention-shapes 4,2048,2048 \
            1,1,8192 --compare sdpa,flex --out "$out/attention-bench"
        run $PYTHON -m fusegen inspect specs/fused_attention.yaml --attention-shapes 4,2048,2048 \
            1,1,8192 ;;
    quantized-chains)
        run $PYTHON -m fusegen build specs/quantized.yaml benchmarks/specs/anchors.yaml \
            --out "$out/quantized-build"
        run $PYTHON benchmarks/quantized_chains.py --built "$out/quantized-build" \
            --out "$out/quantized_chains.json" ;;
    fp8-block-scales)
        run $PYTHON -m fusegen build specs/quantized.yaml --out "$out/fp8-block-build"
        run $PYTHON benchmarks/experiments/fp8_block_scale_fma.py --built "$out/fp8-block-build" ;;
    fp8-block-gluon)
        run $PYTHON -m fusegen build specs/quantized.yaml --out "$out/fp8-gluon-build"
        run $PYTHON benchmarks/experiments/fp8_block_gluon.py --built "$out/fp8-gluon-build" ;;
    fp8-block-runtime)
        run $PYTHON -m pytest tests/test_quant_hopper.py -q -p no:cacheprovider
        run $PYTHON -m fusegen build specs/quantized.yaml --out "$out/fp8-runtime-build"
        run $PYTHON benchmarks/fp8_block_rows.py --built "$out/fp8-runtime-build" \
            --rows 4096 1024 512 128 16 ;;
    fp8-expert-rows)
        run $PYTHON -m fusegen build specs/quantized.yaml --out "$out/fp8-expert-build"
        run $PYTHON benchmarks/fp8_block_rows.py --built "$out/fp8-expert-build" --n 2048 \
            --rows 4096 2048 1024 512 ;;
    int8-decode-gluon)
        run $PYTHON -m fusegen build specs/quantized.yaml --out "$out/int8-gluon-build"
        run $PYTHON benchmarks/experiments/int8_decode_gluon.py --built "$out/int8-gluon-build" ;;
    int4-decode-gluon)
        run $PYTHON -m fusegen build specs/quantized.yaml benchmarks/specs/anchors.yaml \
            --out "$out/int4-gluon-build"
        run $PYTHON benchmarks/experiments/int4_decode_gluon.py --built "$out/int4-gluon-build" ;;
    int4-decode-runtime)
        run $PYTHON -m pytest tests/test_int4_hopper.py generated/test_llama_mlp_int4.py -q \
            -p no:cacheprovider
        run $PYTHON -m fusegen build specs/quantized.yaml benchmarks/specs/anchors.yaml \
            --out "$out/int4-runtime-build"
        run $PYTHON benchmarks/int4_decode_rows.py --built "$out/int4-runtime-build"
        run $PYTHON benchmarks/int4_decode_rows.py --built "$out/int4-runtime-build" --dtype fp16 \
            --rows 1 16 ;;
    quant-decode-profile)
        run $PYTHON -m fusegen build specs/quantized.yaml --out "$out/quant-profile-build"
        run ncu --profile-from-start off --clock-control none --section SpeedOfLight \
            --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
            --section Occupancy --section LaunchStats \
            $PYTHON benchmarks/experiments/profile_quant_decode.py \
            --built "$out/quant-profile-build" ;;
    stream-ceiling)
        run $PYTHON benchmarks/experiments/stream_ceiling.py ;;
    int4-gemv)
        run $PYTHON -m fusegen build specs/quantized.yaml benchmarks/specs/anchors.yaml \
            --out "$out/int4-gemv-build"
        run $PYTHON benchmarks/experiments/int4_unpack_variants.py \
            --built "$out/int4-gemv-build" --rows 1 --out "$out/int4_gemv.json" ;;
    llama-compiled)
        run $PYTHON benchmarks/llama_compiled.py --out "$out/llama_compiled_triton_op.json"
        FUSEGEN_TRITON_OP=0 run $PYTHON benchmarks/llama_compiled.py \
            --out "$out/llama_compiled_opaque.json" ;;
    llama-attention)
        run $PYTHON benchmarks/llama_training_step.py --attention --out "$out/llama_step_attention.json"
        run $PYTHON benchmarks/llama_compiled.py --attention --modes eager,compiled \
            --out "$out/llama_compiled_attention.json"
        # Every op opaque: the launchers run at each call of the compiled graph.
        FUSEGEN_TRITON_OP=0 run $PYTHON benchmarks/llama_compiled.py --attention \
            --modes compiled --out "$out/llama_compiled_attention_opaque.json"
        run $PYTHON benchmarks/llama_decode.py --attention --out "$out/llama_decode_attention.json"
        FUSEGEN_TRITON_OP=0 run $PYTHON benchmarks/llama_decode.py --attention \
            --out "$out/llama_decode_attention_opaque.json" ;;
    llama-prefill)
        run $PYTHON benchmarks/llama_prefill_attention.py --batch 1 --prompt 16384 --rounds 11 \
            --out "$out/llama_prefill_3_8b.json"
        run $PYTHON benchmarks/llama_prefill_attention.py --model 3.2-1b --batch 4 --prompt 4096 \
            --rounds 11 --out "$out/llama_prefill_3_2_1b.json"
        run $PYTHON benchmarks/llama_prefill_attention.py --model 3.2-1b --batch 2 --prompt 4096 \
            --train --rounds 7 --out "$out/llama_step_3_2_1b.json" ;;
    llama-decode)
        for process in 1 2; do
            run $PYTHON benchmarks/llama_decode.py --out "$out/llama_decode_triton_op_$process.json"
            FUSEGEN_TRITON_OP=0 run $PYTHON benchmarks/llama_decode.py \
                --out "$out/llama_decode_opaque_$process.json"
        done
        # Inductor's static launcher for user-defined kernels too (off by default).
        TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=1 run $PYTHON \
            benchmarks/llama_decode.py --modes compiled --out "$out/llama_decode_static_launch.json" ;;
    *)
        run $PYTHON -m fusegen bench --suite "$SUITE" --runs "$name" --out "$out" ;;
    esac
    tail -n 3 "$log" >&2
done
exit $failed
