class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("intentional failure in execute")
