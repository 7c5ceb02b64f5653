import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
# the repository root, for tests that use the benchmarks' tools (benchmarks.plan_cost)
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Under pytest-xdist each worker is a process: one intra-op thread each avoids oversubscribing
# the 2 cores (index_add_ slows down ~100x when 4 threads fight for 2 cores).
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def top_k_growths(tmp_path_factory):
    """``growths(group)``: the peak memory growth of each top-k decoder's call of ``group`` on the 100k-leaf
    tree, measured once per session (memory_testing.top_k_growths_once)."""
    from memory_testing import top_k_growths_once

    return top_k_growths_once(tmp_path_factory)


# HDECODE_TEST_PLAN=cuda runs every test under `hd.plan_for("cuda")`: the GPU plan (depth-first prefix
# sums, fused ops, the GPU strategies) on whatever device the test uses.
if os.environ.get("HDECODE_TEST_PLAN"):
    @pytest.fixture(autouse=True)
    def _plan_for_every_test():
        import hdecode_torch as hd

        with hd.plan_for(os.environ["HDECODE_TEST_PLAN"]):
            yield


# HDECODE_TEST_TRITON_ON_CPU=1 (with TRITON_INTERPRET=1) runs the fused ops' Triton kernels under Triton's CPU
# interpreter wherever the tests call them on the CPU (see triton_testing.route_cpu_calls_to_triton).
if os.environ.get("HDECODE_TEST_TRITON_ON_CPU"):
    from triton_testing import route_cpu_calls_to_triton

    route_cpu_calls_to_triton()
