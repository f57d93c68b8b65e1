import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # The families are kept: as in Triton, a metric whose family is gone raises.
        self.families = [
            pb_utils.MetricFamily(
                name="custom_requests",
                description="requests seen",
                kind=pb_utils.MetricFamily.COUNTER,
            ),
            pb_utils.MetricFamily(
                name="custom_last_value", description="last X", kind=pb_utils.MetricFamily.GAUGE
            ),
            pb_utils.MetricFamily(
                name="custom_x", description="X values", kind=pb_utils.MetricFamily.HISTOGRAM
            ),
        ]
        labels = {"model": "custom_metrics"}
        self.requests = self.families[0].Metric(labels=labels)
        self.last = self.families[1].Metric(labels=labels)
        self.sizes = self.families[2].Metric(labels=labels, buckets=[1.0, 10.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            self.requests.increment(1)
            self.last.set(x)
            self.sizes.observe(x)
            count = pb_utils.Tensor("COUNT", np.array([self.requests.value()], dtype=np.float64))
            responses.append(pb_utils.InferenceResponse([count]))
        return responses
