"""Where things are, for a test in any folder of tests/ (the tests sit in one folder per room of the product)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SRC = ROOT / "src"
DATA = TESTS / "data"  # tool output captured on this kind of machine, hand-written inputs
ARTIFACTS = ROOT / "test-artifacts"  # what a failing browser or lab test keeps for a reader
