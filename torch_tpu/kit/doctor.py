"""`torch-tpu doctor`: the evidence the guide's troubleshooting asks for, and a named finding per misconfiguration.

One report, printed readably or as JSON (`DOCTOR_SCHEMA`): versions, the platform chosen and why, devices and
their memory, the eager mode and every TORCH_TPU_* switch in effect, the compile-cache roots (size, entries,
permissions), the distributed launch variables (and whether MASTER_ADDR answers a TCP connect within a short
timeout), and, inside a Kubernetes pod, its facts (namespace, pod, node, the node selectors its manifest set)
plus the kubectl commands that collect the rest. Each check that finds a misconfiguration adds a finding with a
stable name, a message and a fix; the exit status is 1 when there is any, so a CI step or an init container can
gate on it. A check never raises: what it cannot determine is reported as such.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import socket
import stat
import tempfile
from collections.abc import Mapping
from importlib import metadata
from typing import Any

SCHEMA_VERSION = 1
SERVICE_ACCOUNT_DIR = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
DISTRIBUTED_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "NNODES",
    "NPROC_PER_NODE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "JOB_COMPLETION_INDEX",
    "TPU_WORKER_ID",
    "TPU_WORKER_HOSTNAMES",
)
KUBERNETES_VARIABLES = (
    "POD_NAME",
    "POD_NAMESPACE",
    "NODE_NAME",
    "SERVICE_ACCOUNT",
    "GKE_TPU_ACCELERATOR",
    "GKE_TPU_TOPOLOGY",
    "TPU_ACCELERATOR_TYPE",
    "TPU_TOPOLOGY",
    "TPU_WORKER_ID",
    "TPU_WORKER_HOSTNAMES",
)
# Switches read as "1" = on (or "0" = off for the default-on ones); any other value is a typo or a misread doc.
BOOLEAN_SWITCHES = (
    "TORCH_TPU_LAUNCH_BLOCKING",
    "TORCH_TPU_DEFER_AND_FUSE",
    "TORCH_TPU_DEBUG_NANS",
    "TORCH_TPU_PERSISTENT_CACHE",
    "TORCH_TPU_SKIP_VERSION_CHECK",
    "TORCH_TPU_DIST_HOST",
    "TORCH_TPU_CPU_FALLBACK",
    "TORCH_TPU_CHECK_INDICES",
)
PACKAGES = ("torch", "torch_tpu", "jax", "jaxlib", "libtpu", "libtpu-nightly")
CUDA_PLUGINS = ("jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt")
PLUGINS = {"tpu": ("libtpu", "libtpu-nightly"), "gpu": CUDA_PLUGINS}
_WALK_LIMIT = 200_000  # files counted per cache root before giving up (an estimate is then marked as such)

_string = {"type": "string"}
_finding = {
    "type": "object",
    "required": ["name", "severity", "message", "fix"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9_]+$"},
        "severity": {"enum": ["error", "warning"]},
        "message": _string,
        "fix": _string,
    },
}
DOCTOR_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "torch-tpu doctor report",
    "type": "object",
    "required": ["schema_version", "versions", "platform", "devices", "eager", "caches", "distributed"]
    + ["kubernetes", "findings"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "versions": {"type": "object", "additionalProperties": {"type": ["string", "null"]}},
        "platform": {
            "type": "object",
            "required": ["requested", "chosen", "why", "available"],
            "properties": {"chosen": {"type": ["string", "null"]}, "available": {"type": "object"}},
        },
        "devices": {
            "type": "array",
            "items": {"type": "object", "required": ["index", "kind", "platform", "bytes_limit", "bytes_in_use"]},
        },
        "eager": {"type": "object", "required": ["mode", "switches"]},
        "caches": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "path", "exists", "size_bytes", "entries", "mode", "private", "writable"],
            },
        },
        "distributed": {"type": "object", "required": ["variables", "master"]},
        "kubernetes": {"type": "object", "required": ["in_pod", "namespace", "facts", "commands"]},
        "findings": {"type": "array", "items": _finding},
    },
}


def _finding_of(name: str, severity: str, message: str, fix: str) -> dict[str, str]:
    return {"name": name, "severity": severity, "message": message, "fix": fix}


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check_versions() -> tuple[dict[str, str | None], list[dict[str, str]]]:
    """Installed releases (None: absent) and whether torch/jax/jaxlib are inside the supported ranges, whatever
    TORCH_TPU_SKIP_VERSION_CHECK says (it lets torch_tpu try; it does not make a release supported)."""
    import platform as host

    from torch_tpu.runtime import compat

    found: dict[str, str | None] = {"python": host.python_version()}
    found |= {name: _installed(name) for name in (*PACKAGES, *CUDA_PLUGINS)}
    findings = []
    for name in compat.SUPPORTED:
        release = found.get(name)
        if release is not None and not compat.in_range(name, release):
            ranges = compat.supported_range(name)
            findings.append(
                _finding_of(
                    "unsupported_version",
                    "error",
                    f"{name} {release} is outside torch_tpu's supported range {name}{ranges}",
                    f"install {name}{ranges} (docs/compatibility.md)",
                )
            )
    return found, findings


def _local_devices(backend: str) -> list[Any]:
    import jax

    return jax.local_devices(backend=backend)


def check_platform(
    versions: Mapping[str, str | None],
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, str]]]:
    """What TORCH_TPU_PLATFORM asks, which PJRT platforms have devices here (and why not), what was chosen and
    why. An accelerator plugin installed without devices (a TPU held by another process, a pod that did not
    request google.com/tpu) is a finding: `auto` would otherwise fall back to the CPU silently."""
    from torch_tpu.runtime import platform

    raw = os.environ.get("TORCH_TPU_PLATFORM", "auto")
    info: dict[str, Any] = {"requested": raw, "chosen": None, "why": "", "available": {}}
    findings: list[dict[str, str]] = []
    devices: list[dict[str, Any]] = []
    try:
        requested = platform.requested()
    except ValueError as exc:
        findings.append(_finding_of("invalid_platform", "error", str(exc), "unset it or use auto, tpu, gpu or cpu"))
        return info, devices, findings
    errors: dict[str, str] = {}
    for candidate in ("tpu", "gpu", "cpu"):
        try:
            info["available"][candidate] = len(_local_devices(candidate))
        except RuntimeError as exc:
            info["available"][candidate] = 0
            errors[candidate] = (str(exc).strip().splitlines() or [repr(exc)])[0][:300]
    info["errors"] = errors
    for candidate, packages in PLUGINS.items():
        installed = [name for name in packages if versions.get(name)]
        if installed and not info["available"][candidate]:
            reason = errors.get(candidate, "none found")
            findings.append(
                _finding_of(
                    "plugin_without_devices",
                    "error",
                    f"{', '.join(installed)} installed but no {candidate} device: {reason}",
                    "one process at a time owns a TPU: look for another one holding it; in a pod, request "
                    "google.com/tpu and select a TPU node",
                )
            )
    try:
        chosen = platform.devices()
    except Exception as exc:  # no devices, or a plugin that fails to start (its error is the evidence)
        findings.append(
            _finding_of(
                "no_devices",
                "error",
                str(exc),
                "check the accelerator plugin (libtpu / the CUDA PJRT plugin) or set TORCH_TPU_PLATFORM=auto",
            )
        )
        return info, devices, findings
    info["chosen"] = platform.platform()
    if requested == "auto":
        info["why"] = (
            f"TORCH_TPU_PLATFORM=auto tries tpu, gpu, cpu in that order; the first with devices is {info['chosen']}"
        )
    else:
        info["why"] = f"TORCH_TPU_PLATFORM={requested} asks for it"
    for index, device in enumerate(chosen):
        try:
            stats = device.memory_stats() or {}
        except Exception:  # some PJRT plugins do not implement it
            stats = {}
        devices.append(
            {
                "index": index,
                "id": device.id,
                "kind": device.device_kind,
                "platform": device.platform,
                "bytes_limit": stats.get("bytes_limit"),
                "bytes_in_use": stats.get("bytes_in_use"),
            }
        )
    return info, devices, findings


@functools.cache
def known_switches() -> frozenset[str]:
    """Every TORCH_TPU_* name the package reads, found in its own source (so the list cannot go stale)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    names: set[str] = set()
    for path in root.rglob("*.py"):
        names.update(re.findall(r"TORCH_TPU_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace")))
    return frozenset(names)


def check_switches(env: Mapping[str, str]) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The eager mode the environment selects and every TORCH_TPU_* variable set; unknown names, values a
    boolean switch does not understand, and contradicting eager switches are findings."""
    from torch_tpu.eager import modes

    switches = {k: v for k, v in sorted(env.items()) if k.startswith("TORCH_TPU_")}
    findings = []
    for name, value in switches.items():
        if name not in known_switches():
            findings.append(
                _finding_of(
                    "unknown_switch",
                    "warning",
                    f"{name}={value!r} is not read by torch_tpu (a typo?)",
                    "remove it or spell one of: " + ", ".join(sorted(known_switches())),
                )
            )
        elif name in BOOLEAN_SWITCHES and value not in ("0", "1"):
            findings.append(
                _finding_of(
                    "invalid_switch_value", "warning", f"{name}={value!r}: only '0' and '1' are read", "use 0 or 1"
                )
            )
    if switches.get("TORCH_TPU_LAUNCH_BLOCKING") == "1" and switches.get("TORCH_TPU_DEFER_AND_FUSE") == "1":
        findings.append(
            _finding_of(
                "conflicting_eager_switches",
                "warning",
                "TORCH_TPU_LAUNCH_BLOCKING=1 and TORCH_TPU_DEFER_AND_FUSE=1 are both set; Debug mode wins",
                "set only the mode you want",
            )
        )
    eager = {
        "mode": modes.get_mode().value,
        "from_environment": modes.from_environment().value,
        "debug_nans": modes.state.debug_nans,
        "switches": switches,
    }
    return eager, findings


def cache_roots(env: Mapping[str, str]) -> list[tuple[str, pathlib.Path]]:
    """The compile-cache directories in effect: torch_tpu's persistent tier, JAX's own cache when configured,
    and torch's Inductor/AOTAutograd cache directory."""
    from torch_tpu.runtime import persistent

    roots = [("torch_tpu persistent (tier 3)", persistent.root())]
    import jax

    jax_dir = env.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir
    if jax_dir:
        roots.append(("jax compilation cache", pathlib.Path(jax_dir).expanduser()))
    inductor = env.get("TORCHINDUCTOR_CACHE_DIR")
    if not inductor:
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir

            inductor = default_cache_dir()
        except ImportError:
            inductor = os.path.join(tempfile.gettempdir(), "torchinductor")
    roots.append(("torch inductor / AOTAutograd", pathlib.Path(inductor)))
    return roots


def _size(path: pathlib.Path) -> tuple[int, int, bool]:
    total = entries = 0
    for folder, _, files in os.walk(path):
        for name in files:
            entries += 1
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
            if entries >= _WALK_LIMIT:
                return total, entries, True
    return total, entries, False


def _nearest_existing(path: pathlib.Path) -> pathlib.Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_cache(name: str, path: pathlib.Path) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Size, entries and permissions of one cache root. Entries are unpickled when read, so a directory others
    can write is a way to run code in this process: world-writable is an error, not private a warning."""
    info: dict[str, Any] = {"name": name, "path": str(path), "exists": False, "size_bytes": 0, "entries": 0}
    findings = []
    try:  # a parent this user cannot search raises PermissionError from is_dir/exists as well
        info["exists"] = path.is_dir()
        where = path if info["exists"] else _nearest_existing(path)
        st = where.stat()
    except OSError as exc:
        info |= {"mode": None, "private": False, "writable": False, "error": repr(exc)}
        return info, [_finding_of("cache_unreadable", "warning", f"{name} at {path}: {exc}", "check the path")]
    mode = stat.S_IMODE(st.st_mode)
    writable = os.access(where, os.W_OK | os.X_OK)
    info |= {"mode": oct(mode), "owner_uid": st.st_uid, "writable": writable}
    if info["exists"]:
        info["size_bytes"], info["entries"], info["truncated"] = _size(path)
        world = bool(mode & stat.S_IWOTH)
        private = not mode & (stat.S_IWGRP | stat.S_IWOTH) and st.st_uid == os.getuid()
        info["private"] = private
        if world:
            findings.append(
                _finding_of(
                    "cache_world_writable",
                    "error",
                    f"{name} at {path} is world-writable ({oct(mode)}): any local user can plant entries",
                    f"chmod 700 {path} (or point the cache root at a private directory)",
                )
            )
        elif not private:
            findings.append(
                _finding_of(
                    "cache_not_private",
                    "warning",
                    f"{name} at {path} is {oct(mode)}, owner uid {st.st_uid}; this process is uid {os.getuid()}",
                    f"chown it to this user and chmod 700 {path}",
                )
            )
    else:
        info["private"] = None  # decided by whoever creates it (torch_tpu's own tier: 0700)
        info["created_under"] = str(where)
    if not writable:
        findings.append(
            _finding_of(
                "cache_not_writable",
                "warning",
                f"{name}: {where} is not writable by this process, so compiled programs are not kept",
                "mount a writable volume there (read-only root filesystem: an emptyDir) or move the cache root",
            )
        )
    return info, findings


def _integer(env: Mapping[str, str], name: str, findings: list[dict[str, str]]) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        findings.append(
            _finding_of("invalid_rank_variable", "error", f"{name}={value!r} is not an integer", f"fix {name}")
        )
        return None


def check_distributed(env: Mapping[str, str], connect_timeout: float) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The launch variables, their consistency, and whether the coordinator (MASTER_ADDR:MASTER_PORT) answers."""
    findings: list[dict[str, str]] = []
    variables = {name: env[name] for name in DISTRIBUTED_VARIABLES if name in env}
    rank, world = _integer(env, "RANK", findings), _integer(env, "WORLD_SIZE", findings)
    local_rank, local_world = _integer(env, "LOCAL_RANK", findings), _integer(env, "LOCAL_WORLD_SIZE", findings)
    node_rank = _integer(env, "NODE_RANK", findings)
    port = _integer(env, "MASTER_PORT", findings)
    if "RANK" in env and "WORLD_SIZE" not in env:
        findings.append(
            _finding_of("rank_without_world_size", "error", "RANK is set but WORLD_SIZE is not", "set both, or neither")
        )
    if "WORLD_SIZE" in env and "RANK" not in env and "TORCHELASTIC_RUN_ID" not in env:
        findings.append(
            _finding_of("world_size_without_rank", "error", "WORLD_SIZE is set but RANK is not", "set both, or neither")
        )
    if rank is not None and world is not None and not 0 <= rank < world:
        findings.append(
            _finding_of("rank_out_of_range", "error", f"RANK={rank} is not in 0..{world - 1}", "fix RANK or WORLD_SIZE")
        )
    if local_rank is not None and local_world is not None and not 0 <= local_rank < local_world:
        findings.append(
            _finding_of(
                "local_rank_out_of_range",
                "error",
                f"LOCAL_RANK={local_rank} is not in 0..{local_world - 1}",
                "fix LOCAL_RANK or LOCAL_WORLD_SIZE",
            )
        )
    master: dict[str, Any] = {"address": env.get("MASTER_ADDR"), "port": port or 29500, "reachable": None}
    if world is not None and world > 1 and not env.get("MASTER_ADDR"):
        findings.append(
            _finding_of(
                "master_addr_missing",
                "error",
                f"WORLD_SIZE={world} but MASTER_ADDR is not set: the ranks cannot meet",
                "set MASTER_ADDR to rank 0's host (multi-host Job: the index-0 pod's DNS name)",
            )
        )
    if env.get("MASTER_ADDR"):
        hosts_it = rank == 0 or (rank is None and node_rank == 0)
        if hosts_it:
            master["note"] = "not checked: this process (rank 0 / node 0) is the one that listens"
        else:
            master |= _probe(env["MASTER_ADDR"], master["port"], connect_timeout, findings)
    return {"variables": variables, "master": master}, findings


def _probe(host: str, port: int, timeout: float, findings: list[dict[str, str]]) -> dict[str, Any]:
    try:
        socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        findings.append(
            _finding_of(
                "master_unresolvable",
                "error",
                f"MASTER_ADDR={host} does not resolve: {exc}",
                "check the name (multi-host Job: <job>-0.<headless service>) and the DNS egress rule",
            )
        )
        return {"reachable": False, "error": repr(exc)}
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return {"reachable": True}
    except OSError as exc:
        findings.append(
            _finding_of(
                "master_unreachable",
                "error",
                f"nothing answers at MASTER_ADDR:MASTER_PORT {host}:{port} within {timeout:g} s: {exc}",
                "start rank 0 first, check MASTER_PORT and that the NetworkPolicy allows the job's pods to connect",
            )
        )
        return {"reachable": False, "error": repr(exc)}


def check_kubernetes(env: Mapping[str, str], account_dir: pathlib.Path) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Inside a pod: namespace (service-account file, else the downward API's POD_NAMESPACE), pod, node and the
    node selectors the kit's manifest put in the environment; the kubectl commands for the rest."""
    in_pod = "KUBERNETES_SERVICE_HOST" in env or account_dir.is_dir()
    namespace_file = account_dir / "namespace"
    namespace, source = None, None
    if namespace_file.is_file():
        namespace, source = namespace_file.read_text().strip(), str(namespace_file)
    elif env.get("POD_NAMESPACE"):
        namespace, source = env["POD_NAMESPACE"], "POD_NAMESPACE (downward API)"
    facts = {name: env[name] for name in KUBERNETES_VARIABLES if name in env}
    pod = env.get("POD_NAME") or (env.get("HOSTNAME") if in_pod else None) or "<pod>"
    ns = namespace or "<namespace>"
    node = env.get("NODE_NAME") or "<node>"
    account = env.get("SERVICE_ACCOUNT") or "<service-account>"
    commands = [
        "kubectl get nodes -L cloud.google.com/gke-tpu-accelerator,cloud.google.com/gke-tpu-topology",
        f"kubectl get node {node} --show-labels",
        f"kubectl get pods -n {ns} -o wide",
        f"kubectl describe pod {pod} -n {ns}",
        f"kubectl logs {pod} -n {ns}",
        f"kubectl logs {pod} -n {ns} --previous",
        f"kubectl get events -n {ns} --sort-by=.metadata.creationTimestamp",
        f"kubectl get networkpolicy,serviceaccount,poddisruptionbudget -n {ns} -o yaml",
        f"kubectl auth can-i --list --as=system:serviceaccount:{ns}:{account} -n {ns}",
    ]
    findings = []
    if in_pod and (account_dir / "token").exists():
        findings.append(
            _finding_of(
                "service_account_token_mounted",
                "warning",
                f"a Kubernetes API token is mounted at {account_dir / 'token'}; the workload never needs one",
                "set automountServiceAccountToken: false on the pod and its ServiceAccount (torch-tpu k8s does)",
            )
        )
    info = {
        "in_pod": in_pod,
        "namespace": namespace,
        "namespace_source": source,
        "pod": env.get("POD_NAME") or (env.get("HOSTNAME") if in_pod else None),
        "facts": facts,
        "commands": commands,
    }
    return info, findings


def gather(connect_timeout: float = 2.0, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The whole report (see DOCTOR_SCHEMA); `env` defaults to os.environ."""
    env = dict(os.environ if env is None else env)
    findings: list[dict[str, str]] = []
    versions, found = check_versions()
    findings += found
    platform_info, devices, found = check_platform(versions)
    findings += found
    eager, found = check_switches(env)
    findings += found
    caches = []
    for name, path in cache_roots(env):
        info, found = check_cache(name, path)
        caches.append(info)
        findings += found
    distributed, found = check_distributed(env, connect_timeout)
    findings += found
    kubernetes, found = check_kubernetes(env, SERVICE_ACCOUNT_DIR)
    findings += found
    return {
        "schema_version": SCHEMA_VERSION,
        "versions": versions,
        "platform": platform_info,
        "devices": devices,
        "eager": eager,
        "caches": caches,
        "distributed": distributed,
        "kubernetes": kubernetes,
        "findings": findings,
    }


def exit_code(report: Mapping[str, Any]) -> int:
    """0 when nothing is misconfigured, 1 when there is at least one finding."""
    return 1 if report["findings"] else 0


def _size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def format_text(report: Mapping[str, Any]) -> str:
    """The report for a terminal: one section per concern, findings last."""
    lines = ["versions"]
    lines += [
        f"  {k:<18} {v if v is not None else '-'}" for k, v in report["versions"].items() if v or k in PACKAGES[:4]
    ]
    p = report["platform"]
    lines += ["platform", f"  requested          {p['requested']}", f"  chosen             {p['chosen'] or '-'}"]
    lines += [f"  why                {p['why'] or '-'}"]
    lines.append("  devices found      " + ", ".join(f"{k}: {v}" for k, v in p["available"].items()))
    lines.append("devices")
    for d in report["devices"]:
        memory = f"{_size_text(d['bytes_limit'])} limit" if d["bytes_limit"] else "memory not reported"
        lines.append(f"  tpu:{d['index']:<3} {d['kind']} ({d['platform']}), {memory}")
    e = report["eager"]
    lines += ["eager", f"  mode               {e['mode']}", f"  debug nans         {e['debug_nans']}"]
    lines += [f"  {k} = {v}" for k, v in e["switches"].items()] or ["  no TORCH_TPU_* switch set"]
    lines.append("compile caches")
    for c in report["caches"]:
        state = f"{c['entries']} entries, {_size_text(c['size_bytes'])}" if c["exists"] else "absent (created on use)"
        lines.append(f"  {c['name']}: {c['path']}  [{state}, mode {c['mode']}, private {c['private']}]")
    dist = report["distributed"]
    lines.append("distributed")
    lines += [f"  {k} = {v}" for k, v in dist["variables"].items()] or ["  no launch variable set (one process)"]
    m = dist["master"]
    if m["address"]:
        reach = m.get("note") or ("reachable" if m["reachable"] else f"NOT reachable ({m.get('error')})")
        lines.append(f"  master {m['address']}:{m['port']}: {reach}")
    k = report["kubernetes"]
    lines += ["kubernetes", f"  in a pod           {k['in_pod']}"]
    if k["in_pod"]:
        lines.append(f"  namespace          {k['namespace'] or 'unknown'} ({k['namespace_source'] or 'no source'})")
        lines += [f"  {name} = {value}" for name, value in k["facts"].items()]
    lines.append("  collect the rest with:")
    lines += [f"    {c}" for c in k["commands"]]
    findings = report["findings"]
    lines.append(f"findings ({len(findings)})")
    lines += [f"  {f['severity'].upper()} {f['name']}: {f['message']}\n    fix: {f['fix']}" for f in findings]
    if not findings:
        lines.append("  none: nothing misconfigured that doctor checks")
    return "\n".join(lines)
