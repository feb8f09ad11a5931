"""GLUE-like sentence(-pair) classification and regression: the original tsv layouts (glue
files), the Hub's nyu-mll/glue, the embedded demo set, the paper's metrics and the GLUE
leaderboard files. A new GLUE-like task is a YAML under conf/task/, no code."""
