"""Speed and memory benchmarks. Each prints its figure as a ratio against a baseline measured
in the same run, so numbers from different machines stay comparable. Not tests."""
