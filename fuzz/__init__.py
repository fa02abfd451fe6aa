"""Fuzzing of the trace readers: mutations of real traces and the rule every input must obey.

`fuzz.cases` holds the Hypothesis strategies and the checks; tests/test_fuzz.py runs a few
hundred cases in CI, `python -m fuzz.fuzz_importers` runs thousands.
"""
