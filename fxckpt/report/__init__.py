"""What a plan says to its user.

plan (Plan and PlanEntry: plain data of what is saved, recomputed,
offloaded, why and at what cost; its fingerprint; plans merged over a
step), render (the tables, text and figures of ``explain`` and notebooks).
"""
