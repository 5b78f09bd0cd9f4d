"""Figures drawn from sparksim's files; matplotlib is imported only inside the plotting functions."""
