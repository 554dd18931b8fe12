"""What users call; each re-exported as ``fxckpt.<name>``.

backend (the torch.compile backend and its step ledger), compile
(torch.compile with the backend, plus graph-break regions), transform (one
FX graph module, no Dynamo), explain and pareto (a plan, or the frontier of
plans, for a model and its inputs, without training).
"""
