"""Judging: references, comparisons, tolerances and the Verdict. Pure functions over RunRecords."""
