"""Launching: multi-node torchrun on loopback (the same code as one node), and `set_tpu_launch_env` filling torch's
launch variables from a (faked) TPU VM / Kubernetes environment."""

import os

import launch
import pytest
import torch

import torch_tpu.distributed

_LAUNCH_VARIABLES = (
    "MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "RANK",
    "LOCAL_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE",
    "TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID", "JOB_COMPLETION_INDEX",
)  # fmt: skip


def test_two_nodes_under_torchrun_train_and_reduce_like_one():
    """Two `torchrun --nnodes 2 --node-rank R --nproc-per-node 1` agents on loopback: one job of two ranks."""
    nodes = launch.torchrun_nodes("workers_ddp.multi_node", nnodes=2, timeout=240)
    launch.check(nodes)
    for node in nodes:
        assert f"multi-node rank {node.rank} of 2 ok" in node.output, node.output[-3000:]


@pytest.fixture
def clean_environment(monkeypatch):
    """No launch variable set, and every one restored afterwards, also those set_tpu_launch_env writes: a PET_NNODES
    left behind made a later test's torchrun wait for nodes that never came."""
    for name in _LAUNCH_VARIABLES:
        monkeypatch.setenv(name, "")  # recorded, so that teardown removes what the test wrote
        monkeypatch.delenv(name)
    return monkeypatch


def test_launch_env_from_tpu_worker_hostnames_and_job_index(clean_environment):
    clean_environment.setenv("TPU_WORKER_HOSTNAMES", "host-a, host-b,host-c")
    clean_environment.setenv("JOB_COMPLETION_INDEX", "2")
    written = torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=4)
    expected = {
        "MASTER_ADDR": "host-a",
        "MASTER_PORT": "29500",
        "NNODES": "3",
        "NODE_RANK": "2",
        "NPROC_PER_NODE": "4",
        "LOCAL_WORLD_SIZE": "4",
        "WORLD_SIZE": "12",
    }
    expected.update({f"PET_{name}": expected[name] for name in ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK")})
    expected["PET_NPROC_PER_NODE"] = "4"
    assert written == expected  # several processes per host and no LOCAL_RANK: the launcher assigns the ranks
    assert all(os.environ[name] == value for name, value in expected.items())


def test_launch_env_one_process_per_host_is_a_rank(clean_environment):
    clean_environment.setenv("TPU_WORKER_HOSTNAMES", "10.0.0.5,10.0.0.6")
    clean_environment.setenv("TPU_WORKER_ID", "1")
    written = torch_tpu.distributed.set_tpu_launch_env()
    assert (written["NNODES"], written["NODE_RANK"], written["WORLD_SIZE"]) == ("2", "1", "2")
    assert (written["RANK"], written["LOCAL_RANK"], written["MASTER_ADDR"]) == ("1", "0", "10.0.0.5")


def test_launch_env_keeps_what_is_set_and_ranks_a_launched_process(clean_environment):
    clean_environment.setenv("TPU_WORKER_HOSTNAMES", "a,b")
    clean_environment.setenv("JOB_COMPLETION_INDEX", "1")
    clean_environment.setenv("MASTER_PORT", "1234")
    clean_environment.setenv("MASTER_ADDR", "coordinator")
    clean_environment.setenv("LOCAL_RANK", "3")
    written = torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=4)
    assert "MASTER_PORT" not in written and "MASTER_ADDR" not in written and "LOCAL_RANK" not in written
    assert os.environ["MASTER_PORT"] == "1234" and os.environ["MASTER_ADDR"] == "coordinator"
    assert written["RANK"] == "7" and written["WORLD_SIZE"] == "8"


def test_launch_env_without_a_tpu_environment_is_one_local_node(clean_environment):
    written = torch.tpu.distributed.set_tpu_launch_env()
    assert (written["MASTER_ADDR"], written["NNODES"], written["NODE_RANK"], written["WORLD_SIZE"]) == (
        "127.0.0.1",
        "1",
        "0",
        "1",
    )
    assert written["RANK"] == "0"


@pytest.mark.parametrize(
    ("variables", "arguments", "message"),
    [
        ({"TPU_WORKER_HOSTNAMES": "a,b", "JOB_COMPLETION_INDEX": "2"}, {}, "JOB_COMPLETION_INDEX=2 is not a node rank"),
        ({"JOB_COMPLETION_INDEX": "x"}, {}, "JOB_COMPLETION_INDEX='x' is not an integer"),
        ({"TPU_WORKER_HOSTNAMES": "a,b"}, {"nnodes": 3}, "nnodes=3 but TPU_WORKER_HOSTNAMES lists 2 hosts"),
        ({}, {"nproc_per_node": 0}, "nproc_per_node must be a positive integer"),
        ({"LOCAL_RANK": "4"}, {"nproc_per_node": 4}, "LOCAL_RANK=4 is not below nproc_per_node=4"),
    ],
)
def test_launch_env_rejects_an_inconsistent_environment(clean_environment, variables, arguments, message):
    for name, value in variables.items():
        clean_environment.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        torch.tpu.distributed.set_tpu_launch_env(**arguments)
    assert "WORLD_SIZE" not in os.environ  # nothing written on error


def test_set_device_accepts_the_local_rank_only(clean_environment):
    clean_environment.setenv("LOCAL_RANK", "3")
    torch.tpu.set_device(3)  # what launchers' code and DeviceMesh call on local rank 3: this process's device
    with torch.tpu.device(3):
        assert torch.tpu.current_device() == 0
    with pytest.raises(RuntimeError, match=r"one tpu device per process, tpu:0 or tpu:3 \(LOCAL_RANK\); cannot"):
        torch.tpu.set_device(2)


def test_a_free_port_is_below_the_ephemeral_range_and_bindable():
    """A launcher's port for a server not yet started: outside the range the kernel hands to port-0 binds and to
    outgoing connections, so nothing takes it in between; a server can listen on it."""
    import socket

    from torch_tpu.distributed import launch_env

    low = launch_env._ephemeral_low()
    for _ in range(20):
        port = launch_env.free_port()
        assert 1024 <= port < low, (port, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", port))
            server.listen()
