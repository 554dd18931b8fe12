"""The budget for a training step, as opposed to one graph.

ledger (which graphs and regions a step runs, how often, and the plans that
together fit the step's budget), sizes (dynamic shapes: the largest sizes
planned for and the check that refuses larger ones), fit (budget="fit": a
CUDA device's free memory, less a margin), step (the step's budget as
decisions on numbers, and the step's state). A step's measured peak is
read by memory/measured.py.
"""
