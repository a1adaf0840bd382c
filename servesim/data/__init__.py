"""Readers of measured datasets (aiconfigurator-core tables, Vidur CSVs) into tidy pandas frames."""
