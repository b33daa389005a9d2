"""The models of these tests are tiny: one intra-op thread each (on a loaded CPU, OpenMP threads that wait for
each other make them ten times slower; tests/conftest.py puts the thread count back after each test)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield
