"""A controller written for the original Platoon, unchanged but for the port it prints."""

from platoon.compat.channel import Controller


class OldStyleController(Controller):
    def __init__(self, max_mb, **kwargs):
        super(OldStyleController, self).__init__(**kwargs)
        self.max_mb = max_mb
        self.trained = 0

    def handle_control(self, req, worker_id, req_info):
        if req == "next":
            return "train" if self.trained < self.max_mb else "stop"
        if "done" in req:
            self.trained += req["done"]
            return "ok"
        raise ValueError(req)


if __name__ == "__main__":
    parser = Controller.default_parser()
    parser.add_argument("--max-mb", type=int, default=40)
    args = parser.parse_args()
    controller = OldStyleController(max_mb=args.max_mb, **Controller.default_arguments(args))
    print("PORT %d" % controller.control_port, flush=True)
    controller.serve()
    print("TRAINED %d" % controller.trained, flush=True)
    controller.close()
