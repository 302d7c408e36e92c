#!/usr/bin/env bash
# The device run: torch_tpu on a real chip, in parts that each fit one 10-minute command of a borrowed machine.
#
#   bench/device_run.sh PART [PART ...]   PART: correctness | ops | ops_rest | models | kit | numerics | perf |
#                                               perf_large | fused_large | compile_ahead | runahead | cold_start |
#                                               backward_thread | all
#
# On the TPU machine (../shared/tpu/pack.sh here, then remote.sh setup there), from the project root:
#   source /tmp/tpu/env.sh ours && bench/device_run.sh correctness     (then `ops`, `ops_rest`, `models`: four calls
#   give the correctness verdict, ~1550 s with the staging's ~130 s in a session's 1800; `kit` runs the kit's smoke
#   and evaluation; `numerics` remeasures docs/numerics.md; `perf` and `perf_large` measure speed)
# The device part of the suite is `pytest -m "tpu_device and not children"`: a test's child processes run on the
# XLA CPU platform while pytest holds the chip (tests/conftest.py), so those tests prove nothing there.
# correctness  the platform report, the seed's smoke test eager and compiled, the persistent cache across two
#              processes, the device suite over tests/ but tests/ops and the models part's files: tests/runtime
#              (device, views, dtypes, precision, memory, DLPack), tests/eager (modes, AMP), tests/compile,
#              tests/kernels, tests/profiler, tests/test_on_chip.py
# ops          the elementwise op tests' device part (tests/ops/test_elementwise.py: a call's worth on a v5e)
# ops_rest     the other op tests' device part (tests/ops: random, float32 lowerings) and float64 on the chip for a
#              dozen ops (bench/tpu_numerics.py)
# models       the seven models' tests, eager and compiled, OpInfo, optimizers and training
# kit          `torch-tpu smoke` and `torch-tpu evaluate` of the tiny LM against CPU (its report)
# numerics     the figures of docs/numerics.md (bench/tpu_numerics.py: matmul and conv precision levels,
#              transcendentals, subnormals, bf16) and bench/tpu_compiled_numerics.py (where compiled and eager
#              numbers part, node by node, for GPT-2 and Llama)
# perf         bench/tpu_warmup.py (each op's first call: ours cold, warm and uncached against plain JAX's),
#              bench/eager_overhead.py (a Strict op against the jitted-call floor), bench/tpu_formulations.py
#              (softmax and log-softmax written other ways, in plain JAX), bench/tpu_step.py small (fp32 GPT step: plain JAX, ours in every mode, Google's TorchTPU where staged
#              with pack.sh --google), bench/eager_modes.py (MLP steps, the per-op chain; Google's too where staged)
# perf_large   bench/tpu_step.py large (the ~136M-parameter bf16 GPT step); both tpu_step runs profile 2 more steps
#              of each child (bench/step_profile.py: programs, device-busy time, the costliest HLO ops, and the
#              device time by what each fusion computes, from XLA's HLO dumped beside the capture), and 10 more
#              under cProfile (bench/host_profile.py: where the host thread's time goes)
# fused_large  the large step in Fused eager, each run a cold process on a cache of its own: Google's, ours as it
#              stands, ours with PyTorch's composite products (TORCH_TPU_FUSED_PRODUCTS=0, the cut at 0.7 measured
#              best with them), and the default cut's neighbours (TORCH_TPU_FUSED_BACKWARD_CUT_AT=0.4, 0.6)
# compile_ahead the cold first step of the compiled modes with a training graph's programs compiled ahead (the
#              default on a TPU) and without (TORCH_TPU_COMPILE_AHEAD=0): the small whole step and compiled model,
#              the large compiled model; each run a cold process on a cache of its own
# runahead     the large whole step with a compiled training forward waiting for the backward before it (the
#              default, compile/runahead.py) and running ahead (TORCH_TPU_FORWARD_WAITS_FOR_BACKWARD=0), and the
#              large compiled model waiting: ms a step, PJRT's peak against the steady step's buffers; each run a
#              cold process on a cache of its own
# cold_start   bench/cold_start.py (a process's import, first op and optimizer, the device opened on the calling
#              thread and on a thread while Dynamo imports), then the small step's first step in Strict and Fused
#              eager, ours and Google's, each a cold process on a cache of its own
# backward_thread the small step in every mode with backward passes on the calling thread (the default,
#              runtime/backward_thread.py) and on the autograd engine's device thread
#              (TORCH_TPU_BACKWARD_ON_CALLING_THREAD=0), on one cache: ms a step side by side
# Every step runs under its own timeout (SIGINT first: pytest then writes its report), cut to what is left of
# DEVICE_RUN_BUDGET_S (default 540 s a part); a failed or timed-out step is recorded and the run goes on. Under $OUT
# (default: a fresh temporary folder): one log per part with every step's output (PART.log), the test reports
# (PART-junit.xml), the figures' JSON, and summary.txt with one line per step; at most 8 files for a part, as the
# device tool brings back. Exit status 0 when every step passed.
#   DEVICE_RUN_SMALL=1 TORCH_TPU_PLATFORM=cpu bench/device_run.sh all     the dry run (tests/test_device_run.py)
# DEVICE_RUN_SKIP="STEP ..." leaves those steps out (e.g. "numerics kit_smoke": the ops suite alone in one call).
# DEVICE_RUN_TIMEOUT_SCALE=N gives a slow machine more time; DEVICE_RUN_SMOKE=PATH names the seed's smoke.py;
# DEVICE_RUN_IMPLS the implementations tpu_step runs (default jax,ours,google; the large step's three do not fit
# one call: DEVICE_RUN_IMPLS=jax,ours in one, =google in the next); PEAK_TFLOPS_BF16 is the chip's peak for the MFU
# column (default 197, a v5e); DEVICE_RUN_GOOGLE_ENV the shell commands that set up Google's TorchTPU (default:
# /tmp/tpu/env.sh google where it is staged).
set -u

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$(mktemp -d -t torch_tpu_device_run_XXXXXX)}
PYTHON=${PYTHON:-python3}
BUDGET=${DEVICE_RUN_BUDGET_S:-540}
SMALL=${DEVICE_RUN_SMALL:-0}
SCALE=${DEVICE_RUN_TIMEOUT_SCALE:-1}
WORK=$(mktemp -d -t torch_tpu_device_work_XXXXXX) # scratch that does not come back (caches, reports)
mkdir -p "$OUT"
FAILED=0 STEP_STATUS=0
# Several processes run one after another: JAX must not take 75% of the device's memory in each.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
# DEVICE_RUN_CACHE=DIR keeps the compiled programs between calls (e.g. /tmp/tpu/cache on the TPU machine, whose /tmp
# outlives a command): a second call of a part recompiles only what changed. Default: a fresh cache per run.
CACHE=${DEVICE_RUN_CACHE:-$WORK/cache}
export TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT="$CACHE/torch_tpu" TORCHINDUCTOR_CACHE_DIR="$CACHE/inductor"
cd "$REPO" || exit 2

# step NAME CAP_SECONDS COMMAND...: runs COMMAND under `timeout`, its output appended to $OUT/$PART.log (and, until
# the next step, in $WORK/step.log). TORCH_TPU_TEST_DEADLINE, 25 s before the timeout, lets a pytest step skip the
# tests that would start later and end by itself with its report (an interrupt can be held by the chip's runtime
# until the kill).
step() {
    local name=$1 cap=$(($2 * SCALE))
    shift 2
    local left=$((BUDGET - (SECONDS - PART_START) - 5))
    if [[ " ${DEVICE_RUN_SKIP:-} " == *" $name "* ]]; then
        echo "SKIP  $PART/$name (DEVICE_RUN_SKIP)" >>"$OUT/summary.txt"
        STEP_STATUS=0
        : >"$WORK/step.log"
        return
    fi
    if ((left < 15)); then
        echo "SKIP  $PART/$name (the part's budget of ${BUDGET} s is spent)" >>"$OUT/summary.txt"
        STEP_STATUS=0
        : >"$WORK/step.log"
        return
    fi
    local limit=$((cap < left ? cap : left)) began=$SECONDS
    echo "== $PART/$name (timeout ${limit} s)" | tee -a "$LOG"
    TORCH_TPU_TEST_DEADLINE=$(($(date +%s) + limit - 25)) \
        timeout --signal=INT --kill-after=15 "$limit" "$@" >"$WORK/step.log" 2>&1
    local status=$? took=$((SECONDS - began))
    STEP_STATUS=$status
    cat "$WORK/step.log" >>"$LOG"
    tail -n 15 "$WORK/step.log"
    local line="PASS  $PART/$name (${took} s)"
    if ((status == 124 || status == 137)); then
        line="FAIL  $PART/$name (timed out after ${limit} s)"
    elif ((status != 0)); then
        line="FAIL  $PART/$name (exit status $status, ${took} s)"
    fi
    [[ $line == FAIL* ]] && FAILED=$((FAILED + 1))
    echo "$line" | tee -a "$LOG" >>"$OUT/summary.txt"
}

# pytest_part NAME CAP SMALL_K PATHS...: the device part of the suite under PATHS, in this one process (one process
# holds the chip); the dry run takes only the tests SMALL_K (a -k expression) selects.
# The summary gets pytest's counts; a suite cut at the deadline (`step`) is INCOMPLETE, not a pass. A process that
# dies in a test (XLA's compiler aborts it on what it cannot compile) is started again, at most 3 times, after that
# test, which the summary names as CRASH (the journal: torch_tpu/testing/journal.py); then the failures' texts,
# which the dead process's report lost, go to the log.
pytest_part() {
    local name=$1 cap=$2 small_k=$3
    shift 3
    local select=(-m "tpu_device and not children") # a test's children would run on the CPU platform (conftest)
    [ "$SMALL" = 1 ] && select=(-m "tpu_device and not children and not slow" -k "$small_k")
    export TORCH_TPU_TEST_JOURNAL="$WORK/$name.journal"
    : >"$TORCH_TPU_TEST_JOURNAL"
    local restarts=0 crashed
    while :; do
        step "$name" "$cap" "$PYTHON" -m pytest -v -p no:cacheprovider -rfEs --tb=short --durations=15 \
            "${select[@]}" --junitxml="$OUT/$PART-junit.xml" "$@"
        pytest_counts "$name"
        crashed=$("$PYTHON" torch_tpu/testing/journal.py "$TORCH_TPU_TEST_JOURNAL")
        ((STEP_STATUS > 128 && STEP_STATUS != 137)) && [ -n "$crashed" ] && ((restarts < 3)) || break
        echo "CRASH  $PART/$name: $crashed (exit status $STEP_STATUS: the process died in it; resumed after it)" |
            tee -a "$LOG" >>"$OUT/summary.txt"
        restarts=$((restarts + 1))
    done
    if ((restarts > 0)); then
        echo "== $PART/$name: the failures, from the journal" >>"$LOG"
        "$PYTHON" torch_tpu/testing/journal.py "$TORCH_TPU_TEST_JOURNAL" --failures >>"$LOG"
    fi
    unset TORCH_TPU_TEST_JOURNAL
}

# pytest_counts NAME: the summary line of the last pytest step's counts (INCOMPLETE when cut at the deadline).
pytest_counts() {
    local counts spent
    counts=$(grep -E "^=+ .*(passed|failed|error|skipped).* in [0-9.]+s" "$WORK/step.log" | tail -n 1 | tr -d '=')
    spent=$(grep -E "^SKIPPED \[[0-9]+\].*TORCH_TPU_TEST_DEADLINE" "$WORK/step.log" | sed -E 's/^SKIPPED \[([0-9]+)\].*/\1/')
    [ -z "$counts" ] && return
    if ((${spent:-0} > 0)); then # not a pass: part of the suite did not run
        FAILED=$((FAILED + 1))
        echo "INCOMPLETE  $PART/$1:${counts}(${spent} of them skipped at the deadline)" >>"$OUT/summary.txt"
    else
        echo "      $PART/$1:${counts}" >>"$OUT/summary.txt"
    fi
}

part_correctness() {
    step platform 120 "$PYTHON" bench/device_platform.py
    local smoke=""
    for candidate in ${DEVICE_RUN_SMOKE:-} /tmp/tpu/smoke.py shared/seeds/smoke.py ../shared/seeds/smoke.py; do
        [ -f "$candidate" ] && smoke=$candidate && break
    done
    if [ -n "$smoke" ]; then
        step smoke_eager 90 env EXECUTION_MODE=eager "$PYTHON" "$smoke"
        step smoke_compiled 120 env EXECUTION_MODE=compiled "$PYTHON" "$smoke"
    else
        echo "SKIP  $PART/smoke (no smoke.py: DEVICE_RUN_SMOKE, /tmp/tpu or shared/seeds)" >>"$OUT/summary.txt"
    fi
    local size=(--layers 1 --d-model 64 --heads 2 --seq 32 --batch 2 --vocab 128 --steps 2 --warmup 1)
    step cache_two_processes 150 "$PYTHON" bench/compile_step.py --warm-check --require-warm "${size[@]}"
    pytest_part device_suite 420 "device_name or on_chip" tests --ignore=tests/models --ignore=tests/ops \
        --ignore=tests/test_opinfo.py --ignore=tests/test_optimizers.py --ignore=tests/test_training.py
}

part_ops() {
    # the elementwise tests alone: 501 on a v5e took 430 s on a cold cache (the sixth run; int64 division and
    # remainder programs compile for 15-20 s each there)
    pytest_part ops_suite 540 "test_binary and add" tests/ops/test_elementwise.py
}

part_ops_rest() {
    # the other op tests (random, float32 lowerings: ~180 s on a v5e) and float64 for a dozen ops (all of
    # tests/test_opinfo.py's list takes minutes: `numerics` part; 50-70 s on a v5e)
    step numerics 100 "$PYTHON" bench/tpu_numerics.py --json "$OUT/numerics.json" --sections float64 \
        --float64-ops pow,atan2,prod,exp,log,tan,sum,mm,cumprod,linalg.det,div.floor_rounding,logsumexp
    pytest_part ops_suite 400 "test_random and normal" tests/ops --ignore=tests/ops/test_elementwise.py
}

part_models() {
    pytest_part models_suite 480 "lstm and not compiled" tests/models tests/test_opinfo.py tests/test_optimizers.py \
        tests/test_training.py
}

part_kit() {
    # `torch-tpu smoke`: two processes, each ~25-30 s on a v5e, as the seed's smoke test is; `evaluate`: ~170 s
    step kit_smoke 120 "$PYTHON" -m torch_tpu.kit.cli smoke
    local evaluate_size=()
    [ "$SMALL" = 1 ] && evaluate_size=(--modes eager --iterations 5)
    step kit_evaluate 240 "$PYTHON" -m torch_tpu.kit.cli evaluate examples.workloads:tiny_lm --reference cpu \
        --prices torch_tpu/kit/example_prices.json --out "$WORK/report" "${evaluate_size[@]}"
    [ -f "$WORK/report/report.json" ] && cp "$WORK/report/report.json" "$OUT/evaluate-report.json"
}

part_numerics() {
    local sections=matmul,transcendental,subnormal,bf16
    [ "$SMALL" = 1 ] && sections=subnormal,bf16
    step numerics_tables 200 "$PYTHON" bench/tpu_numerics.py --json "$OUT/numerics_tables.json" --sections "$sections"
    local models=(--models gpt2,llama)
    [ "$SMALL" = 1 ] && models=(--models gpt2 --max-graphs 1)
    step compiled_numerics 300 "$PYTHON" bench/tpu_compiled_numerics.py "${models[@]}" \
        --json "$OUT/compiled_numerics.json"
}

# the shell commands that set up Google's TorchTPU: DEVICE_RUN_GOOGLE_ENV, or the staging's where it is staged
google_env() {
    local env=${DEVICE_RUN_GOOGLE_ENV:-}
    [ -z "$env" ] && [ -d /tmp/tpu/google ] && env="source /tmp/tpu/env.sh google"
    echo "$env"
}

# tpu_step SIZE: bench/tpu_step.py at SIZE, plain JAX, ours in every mode, and Google's TorchTPU where it is staged
tpu_step() {
    local size=$1 cap=$2 google=()
    [ "$SMALL" = 1 ] && size=tiny
    local google_env
    google_env=$(google_env)
    [ -n "$google_env" ] && google=(--google-env "$google_env")
    local steps=(--steps 10 --warmup 3 --host-profile 10)
    [ "$SMALL" = 1 ] && steps=(--steps 2 --warmup 1 --host-profile 2)
    step "tpu_step_$1" "$cap" "$PYTHON" bench/tpu_step.py --size "$size" "${steps[@]}" "${google[@]}" \
        --impls "${DEVICE_RUN_IMPLS:-jax,ours,google}" --peak-tflops "${PEAK_TFLOPS_BF16:-197}" \
        --json "$OUT/tpu_step_$1.json" --profile "$WORK/profile_$1" --dump-hlo
}

part_perf() {
    step warmup 120 "$PYTHON" bench/tpu_warmup.py --json "$OUT/warmup.json" --variants jax,ours,ours_xla,ours_warm
    local overhead_size=(--repeats 7 --profile 20)
    [ "$SMALL" = 1 ] && overhead_size=(--ops 40 --repeats 2 --params 16)
    step eager_overhead 180 "$PYTHON" bench/eager_overhead.py "${overhead_size[@]}"
    local formulation_size=()
    [ "$SMALL" = 1 ] && formulation_size=(--scale 0.02 --repeats 2)
    step formulations 90 "$PYTHON" bench/tpu_formulations.py "${formulation_size[@]}"
    tpu_step small 560  # JAX, ours and Google's: 445 s in the tenth run (a call of its own: DEVICE_RUN_SKIP the rest)
    local eager_size=(--rounds 5 --steps 10 --warmup 3)
    [ "$SMALL" = 1 ] && eager_size=(--rounds 1 --steps 2 --warmup 1)
    step eager_modes 120 "$PYTHON" bench/eager_modes.py "${eager_size[@]}"
    local google_env  # the same workloads on Google's TorchTPU, in a process of its own
    google_env=$(google_env)
    if [ -n "$google_env" ]; then
        step eager_modes_google 150 bash -c "$google_env && $PYTHON bench/eager_modes.py ${eager_size[*]}"
    fi
}

part_perf_large() {
    tpu_step large 560
}

part_fused_large() {
    local size=large steps=(--steps 10 --warmup 3) google_env
    [ "$SMALL" = 1 ] && size=tiny steps=(--steps 2 --warmup 1)
    local common=("$PYTHON" bench/tpu_step.py --size "$size" "${steps[@]}" --modes fused --peak-tflops
        "${PEAK_TFLOPS_BF16:-197}")
    google_env=$(google_env)
    if [ -n "$google_env" ]; then
        step fused_google 120 "${common[@]}" --impls google --google-env "$google_env"
    fi
    local name setting
    for setting in default "TORCH_TPU_FUSED_PRODUCTS=0 TORCH_TPU_FUSED_BACKWARD_CUT_AT=0.7" \
        TORCH_TPU_FUSED_BACKWARD_CUT_AT=0.4 TORCH_TPU_FUSED_BACKWARD_CUT_AT=0.6; do
        name=fused_$(echo "$setting" | tr -cs 'A-Za-z0-9.' '_' | sed 's/TORCH_TPU_FUSED_//g; s/_$//')
        [ "$setting" = default ] && setting=
        # shellcheck disable=SC2086  # the setting's words are VAR=VALUE pairs for env
        step "$name" 120 env $setting TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT="$WORK/cache_$name" \
            "${common[@]}" --impls ours --profile "$WORK/profile_$name"
    done
}

part_compile_ahead() {
    local steps=(--steps 10 --warmup 3) small=small large=large
    [ "$SMALL" = 1 ] && steps=(--steps 2 --warmup 1) small=tiny large=tiny
    local run size mode setting name
    for run in "$small whole_step" "$small compiled" "$large compiled"; do
        read -r size mode <<<"$run"
        for setting in 1 0; do
            name=ahead_${setting}_${size}_$mode
            step "$name" 150 env TORCH_TPU_COMPILE_AHEAD=$setting TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT="$WORK/cache_$name" \
                TORCHINDUCTOR_CACHE_DIR="$WORK/inductor_$name" "$PYTHON" bench/tpu_step.py --size "$size" "${steps[@]}" \
                --impls ours --modes "$mode" --peak-tflops "${PEAK_TFLOPS_BF16:-197}"
        done
    done
}

part_runahead() {
    local steps=(--steps 10 --warmup 3) large=large
    [ "$SMALL" = 1 ] && steps=(--steps 2 --warmup 1) large=tiny
    local run mode setting name
    for run in "whole_step 1" "whole_step 0" "compiled 1"; do
        read -r mode setting <<<"$run"
        name=runahead_${setting}_${large}_$mode
        step "$name" 180 env TORCH_TPU_FORWARD_WAITS_FOR_BACKWARD=$setting \
            TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT="$WORK/cache_$name" TORCHINDUCTOR_CACHE_DIR="$WORK/inductor_$name" \
            "$PYTHON" bench/tpu_step.py --size "$large" "${steps[@]}" --impls ours --modes "$mode" \
            --peak-tflops "${PEAK_TFLOPS_BF16:-197}"
    done
}

part_cold_start() {
    local rounds=3 steps=(--steps 10 --warmup 3) size=small google=() google_env
    [ "$SMALL" = 1 ] && rounds=1 steps=(--steps 2 --warmup 1) size=tiny
    step cold_start 240 "$PYTHON" bench/cold_start.py --rounds "$rounds"
    google_env=$(google_env)
    [ -n "$google_env" ] && google=(--google-env "$google_env")
    step cold_first_step 300 env TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT="$WORK/cache_cold" \
        TORCHINDUCTOR_CACHE_DIR="$WORK/inductor_cold" "$PYTHON" bench/tpu_step.py --size "$size" "${steps[@]}" \
        "${google[@]}" --impls "ours${google_env:+,google}" --modes strict,fused --peak-tflops "${PEAK_TFLOPS_BF16:-197}"
}

part_backward_thread() {
    local steps=(--steps 10 --warmup 3) size=small setting
    [ "$SMALL" = 1 ] && steps=(--steps 2 --warmup 1) size=tiny
    for setting in 1 0; do
        step "backward_thread_$setting" 270 env TORCH_TPU_BACKWARD_ON_CALLING_THREAD=$setting \
            TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT="$WORK/cache_backward" TORCHINDUCTOR_CACHE_DIR="$WORK/inductor_backward" \
            "$PYTHON" bench/tpu_step.py --size "$size" "${steps[@]}" --impls ours \
            --modes strict,fused,compiled,whole_step --peak-tflops "${PEAK_TFLOPS_BF16:-197}"
    done
}

PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(correctness)
[ "${PARTS[*]}" = all ] && PARTS=(correctness ops ops_rest models kit numerics perf perf_large fused_large compile_ahead runahead
    cold_start backward_thread)
for PART in "${PARTS[@]}"; do
    case $PART in
    correctness | ops | ops_rest | models | kit | numerics | perf | perf_large | fused_large | compile_ahead | runahead | \
        cold_start | backward_thread) ;;
    *)
        echo "device_run.sh: unknown part '$PART' (correctness, ops, ops_rest, models, kit, numerics, perf, perf_large," \
            "fused_large, compile_ahead, runahead, cold_start, backward_thread or all)" >&2
        exit 2
        ;;
    esac
done
# Byte-compile torch and torch_tpu as an install would: the staging installs with --no-compile and the machine does
# not write .pyc files, so every process compiled ~1200 modules from source (2.4 s of each cold start on a v5e host,
# charged to torch and torch_tpu but not to JAX, whose packages ship compiled). Up-to-date files are skipped.
if [ "$SMALL" != 1 ]; then
    "$PYTHON" - <<'PY' 2>/dev/null || true
import compileall, importlib.util, pathlib
for name in ("torch", "torch_tpu"):
    spec = importlib.util.find_spec(name)
    if spec and spec.origin:
        compileall.compile_dir(str(pathlib.Path(spec.origin).parent), quiet=2, workers=0)
PY
fi
for PART in "${PARTS[@]}"; do
    PART_START=$SECONDS
    LOG="$OUT/$PART.log"
    : >"$LOG"
    commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')
    echo "device_run $PART: $(date -u +%FT%TZ), commit $commit" \
        "$(git -C "$REPO" status --porcelain 2>/dev/null | grep -q . && echo '(with uncommitted changes)')" \
        | tee -a "$OUT/summary.txt" "$LOG"
    "part_$PART"
    echo "device_run $PART: $((SECONDS - PART_START)) s" | tee -a "$OUT/summary.txt"
done
rm -rf "$WORK"
echo "--- $OUT/summary.txt"
cat "$OUT/summary.txt"
exit $((FAILED > 0))
