class TritonPythonModel:
    def initialize(self, args):
        lorem_ipsum  # noqa: F821 - the NameError is the point

    def execute(self, requests):
        return []
