"""Replies once the job has ended: a worker that comes too late is told so at once,
instead of waiting for its timeout."""

import logging
import threading
from typing import Optional

import zmq

from .. import protocol
from ..errors import ProtocolError

log = logging.getLogger("platoon.controller")  # the controller's log: users filter on its name


class AfterJobReplies:
    """Answers every request on the control socket `sock` that job `job_id` has ended
    (DONE is simply accepted, and so is a stop request: the job has stopped), on a thread
    of its own, from `start` until `stop`."""

    def __init__(self, sock, job_id: str):
        self._sock = sock
        self._job_id = job_id
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self, workers: int) -> None:
        """Start answering; `workers`: how many the job had (said in the replies)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._answer, args=(workers,),
                                        name="platoon-afterword", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop answering (waits up to 5 s for the thread). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def _answer(self, workers: int) -> None:
        message = ("job %s has ended: its %d worker(s) are done and the controller no longer "
                   "serves, so this worker came too late. Start every worker while the "
                   "controller serves, and give it num_workers=N so that it waits for all of "
                   "them" % (self._job_id, workers))
        sock = self._sock
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if not poller.poll(100):
                    continue
                frames = sock.recv_multipart()
                envelope, payload = frames[:-1], frames[-1]
                try:
                    request = protocol.decode_request(payload)
                except ProtocolError:
                    request = None
                seq = request.seq if request is not None else None
                if request is not None and request.req == protocol.DONE:
                    reply = protocol.encode_reply(seq, None)
                elif request is not None and request.req == protocol.STOP:  # harmless: ended
                    reply = protocol.encode_reply(seq, {"stop": True, "by": None,
                                                        "reason": "the job has ended"})
                else:
                    reply = protocol.encode_error(seq, "JobEnded", message)
                sock.send_multipart(envelope + [reply])
        except zmq.ZMQError as exc:  # the socket closed under us: nothing left to answer
            log.debug("after-job replies stopped: %s", exc)
