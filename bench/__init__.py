"""Benchmarks of taogpud beside what users would pick instead (issue 8); not part of the tests."""
