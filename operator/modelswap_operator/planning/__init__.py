"""The planner's parts: eligibility (selectors, taints), capacity (fit, best fit), results.

The public entry point is `modelswap_operator.planner.plan`.
"""
