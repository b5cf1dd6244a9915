"""The part of one training process that differs between the benchmark's methods: the
plain single process is this base class; the methods' subclasses (methods.py, and
torchft_diloco.py, which methods.py loads only when asked) sync, evaluate and stop their way."""


class Member:
    """The method-specific part of one process: set up, sync after a step, the model to
    evaluate, agree on stopping, close. The plain single process is this base class."""

    def __init__(self, job, rank, model):
        self.job, self.rank, self.model = job, rank, model
        self.stop_event = None

    def setup(self):
        return self.model

    def use_optimizer(self, optimizer):
        """The optimizer the process trains `setup()`'s model with (made after setup)."""

    def after_step(self, step):
        """Sync if it is time; returns False when told to stop."""
        return True

    def eval_model(self):
        return self.model

    def agree_stop(self, stop):
        """Called at every evaluation by every process; rank 0's `stop` decides."""
        return stop

    def stats(self):
        return {}

    def close(self):
        pass
