class TritonPythonModel:
    def execute(self, requests):
        return []
