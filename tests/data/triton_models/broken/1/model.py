"""Fails to initialize, on purpose."""


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("weights are missing on purpose")

    def execute(self, requests):
        return []
