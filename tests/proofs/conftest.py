"""One parametric encoding (the spec unmutated, FAST's constants) for the parametric tests."""
import pytest

from proofs.parametric import PEncoding
from proofs.run import FAST


@pytest.fixture(scope="session")
def penc():
    return PEncoding(FAST)
