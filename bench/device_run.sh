#!/usr/bin/env bash
# One borrowed accelerator run, prepared: torch and JAX are installed there and nothing can be downloaded.
#
# Installs torch_tpu from this working tree without dependencies (into a folder of its own, not the machine's
# environment), then, on TORCH_TPU_PLATFORM (default gpu; or the first argument), runs:
#   the platform report, the device checks (a pytest subset, if pytest is there), the seed smoke test
#   (shared/seeds/smoke.py or ../shared/seeds/smoke.py, unmodified) eager and compiled, bench/compile_step.py in
#   float32 and bfloat16, bench/eager_modes.py, and bench/kernels.py's attention (the platform's kernel vs XLA).
# Every step has its own timeout, cut to what is left of DEVICE_RUN_BUDGET_S (default 540 s, so the whole run fits
# one 10-minute borrowed command); a failed or timed-out step is recorded and the run goes on; the summary at the
# end has one line per step. All output lands under $OUT (default: a fresh temporary folder), one log per step.
#
#   bench/device_run.sh [platform]            e.g. OUT=/tmp/out bench/device_run.sh gpu
#   DEVICE_RUN_SMALL=1 TORCH_TPU_PLATFORM=cpu bench/device_run.sh    the dry run (CPU platform, small sizes;
#   DEVICE_RUN_TIMEOUT_SCALE=N and DEVICE_RUN_BUDGET_S=S give a slow, shared machine more time)
# DEVICE_RUN_SMOKE=PATH names smoke.py where it is elsewhere. PEAK_TFLOPS_FP32 / PEAK_TFLOPS_BF16 (the device's
# peaks) make compile_step print the MFU.
set -u

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PLATFORM=${1:-${TORCH_TPU_PLATFORM:-gpu}}
OUT=${OUT:-$(mktemp -d -t torch_tpu_device_run_XXXXXX)}
PYTHON=${PYTHON:-python3}
BUDGET=${DEVICE_RUN_BUDGET_S:-540}
SMALL=${DEVICE_RUN_SMALL:-0}
SCALE=${DEVICE_RUN_TIMEOUT_SCALE:-1} # multiplies every step's timeout (a loaded machine's dry run)
mkdir -p "$OUT"
START=$SECONDS
SUMMARY=()
FAILED=0

export TORCH_TPU_PLATFORM=$PLATFORM
# Several processes run one after another: JAX must not take 75% of the device's memory in each.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT="$OUT/cache/torch_tpu"
export TORCHINDUCTOR_CACHE_DIR="$OUT/cache/inductor"

# step NAME CAP_SECONDS COMMAND...: runs COMMAND from the repository root under `timeout`, output in $OUT/NAME.log.
step() {
    local name=$1 cap=$(($2 * SCALE))
    shift 2
    local left=$((BUDGET - (SECONDS - START) - 5))
    if ((left < 15)); then
        SUMMARY+=("SKIP  $name (the run's budget of ${BUDGET} s is spent)")
        return
    fi
    local limit=$((cap < left ? cap : left))
    local began=$SECONDS
    echo "== $name (timeout ${limit} s)"
    (cd "$REPO" && timeout --kill-after=10 "$limit" "$@") >"$OUT/$name.log" 2>&1
    local status=$? took=$((SECONDS - began))
    tail -n 25 "$OUT/$name.log"
    if ((status == 0)); then
        SUMMARY+=("PASS  $name (${took} s)")
    elif ((status == 124 || status == 137)); then
        SUMMARY+=("FAIL  $name (timed out after ${limit} s)")
        FAILED=$((FAILED + 1))
    else
        SUMMARY+=("FAIL  $name (exit status $status, ${took} s)")
        FAILED=$((FAILED + 1))
    fi
}

# --- install: pip into a folder of its own (no index, no dependencies, no build isolation); without setuptools
# or pip, the working tree itself plus the package metadata torch's autoload and `version("torch_tpu")` read.
SITE="$OUT/site"
install_torch_tpu() {
    if "$PYTHON" -m pip install --no-index --no-deps --no-build-isolation --target "$SITE" "$REPO"; then
        return 0
    fi
    echo "pip could not install the working tree (no setuptools here?): using it in place with a metadata shim"
    local version
    version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/pyproject.toml")
    local info="$SITE/torch_tpu-$version.dist-info"
    rm -rf "$SITE" && mkdir -p "$info"
    printf 'Metadata-Version: 2.1\nName: torch_tpu\nVersion: %s\n' "$version" >"$info/METADATA"
    printf '[torch.backends]\ntorch_tpu = torch_tpu._loader:load\n\n[torch_dynamo_backends]\n' >"$info/entry_points.txt"
    printf 'tpu = torch_tpu.compile.backend:backend\n' >>"$info/entry_points.txt"
    echo "$REPO" >"$SITE/torch_tpu_working_tree.pth"
}
export -f install_torch_tpu
export PYTHON SITE REPO
step install 120 bash -c install_torch_tpu
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

step platform 90 "$PYTHON" -c '
import json, platform, jax, torch, torch_tpu
from importlib.metadata import version
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__, "jax": jax.__version__,
    "jaxlib": version("jaxlib"), "torch_tpu": version("torch_tpu"), "from": torch_tpu.__file__,
    "jax_devices": [str(d) for d in jax.devices()], "tpu_device": torch.tpu.get_device_name(),
    "tpu_count": torch.tpu.device_count()}, indent=1))
x = torch.randn(256, 256)
d = (x.to("tpu") @ x.to("tpu")).cpu()
torch.testing.assert_close(d, x @ x, rtol=1e-4, atol=1e-4)
print("matmul on tpu matches CPU; float64 on device:", torch.ones(2, dtype=torch.float64, device="tpu").dtype)
'

if "$PYTHON" -c "import pytest" 2>/dev/null; then
    step device_checks 150 "$PYTHON" -m pytest -q -p no:cacheprovider -m "not slow" \
        tests/test_device.py tests/test_device_checks.py tests/test_platform_numerics.py tests/test_precision.py \
        --junitxml="$OUT/device_checks.xml"
else
    SUMMARY+=("SKIP  device_checks (no pytest on this machine)")
fi

SMOKE=""
for candidate in ${DEVICE_RUN_SMOKE:-} "$REPO/shared/seeds/smoke.py" "$REPO/../shared/seeds/smoke.py"; do
    [ -f "$candidate" ] && SMOKE=$candidate && break
done
if [ -n "$SMOKE" ]; then
    step smoke_eager 90 env EXECUTION_MODE=eager "$PYTHON" "$SMOKE"
    step smoke_compiled 120 env EXECUTION_MODE=compiled "$PYTHON" "$SMOKE"
else
    SUMMARY+=("SKIP  smoke (no shared/seeds/smoke.py in the repository or beside it)")
fi

if [ "$SMALL" = 1 ]; then
    COMPILE_SIZE=(--layers 1 --d-model 64 --heads 2 --seq 32 --batch 2 --vocab 128 --steps 3 --warmup 1)
    EAGER_SIZE=(--rounds 1 --steps 2 --warmup 1)
    KERNEL_SIZE=(--batch 1 --heads 2 --length 128 --dim 32 --repeats 1)
else
    COMPILE_SIZE=(--steps 10 --warmup 2)
    EAGER_SIZE=(--rounds 5 --steps 10 --warmup 3)
    KERNEL_SIZE=(--repeats 3)
fi
PEAK32=()
PEAK16=()
[ -n "${PEAK_TFLOPS_FP32:-}" ] && PEAK32=(--peak-tflops "$PEAK_TFLOPS_FP32")
[ -n "${PEAK_TFLOPS_BF16:-}" ] && PEAK16=(--peak-tflops "$PEAK_TFLOPS_BF16")
# Inductor is a CPU reference here and compiles C++ for minutes: skipped.
step compile_step_fp32 120 "$PYTHON" bench/compile_step.py --skip-inductor --dtype float32 "${COMPILE_SIZE[@]}" \
    "${PEAK32[@]}"
step compile_step_bf16 120 "$PYTHON" bench/compile_step.py --skip-inductor --dtype bfloat16 "${COMPILE_SIZE[@]}" \
    "${PEAK16[@]}"
step eager_modes 150 "$PYTHON" bench/eager_modes.py "${EAGER_SIZE[@]}"
step kernels 90 "$PYTHON" bench/kernels.py --sections attention "${KERNEL_SIZE[@]}"

{
    echo "device_run on TORCH_TPU_PLATFORM=$PLATFORM, $((SECONDS - START)) s; logs in $OUT"
    printf '%s\n' "${SUMMARY[@]}"
} | tee "$OUT/summary.txt"
exit $((FAILED > 0))
