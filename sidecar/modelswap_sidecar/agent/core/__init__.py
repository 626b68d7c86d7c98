"""The lifecycle core: the records the agent holds per model, the actuator that loads,
swaps and unloads them, the loops that drive it, and the pure views and placement it
decides from. Nothing here talks to the control API, the gateway or the cluster."""
