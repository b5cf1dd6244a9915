"""The control socket's requests: read one, route it, reply.

Requests named ``platoon-...`` (reserved) go through a table to the part that
handles them; any other goes to the user's `Controller.handle_control`. Every
request but registration must come from a registered connection. A request
that fails gets an error reply; the controller keeps serving.
"""

import logging
import os
import time
import traceback
from typing import Any, Optional

import zmq

from .. import protocol
from .._os.logthrottle import ThrottledLog
from ..errors import NotRegistered, PlatoonError, ProtocolError
from .registry import HOSTNAME, WorkerRecord
from .services import ControllerServices

log = logging.getLogger("platoon.controller")  # the controller's log: users filter on its name


class RequestDispatcher:
    """Serves the control socket `sock` for `ctl` (the Controller, held weakly, seen as
    its `ControllerServices`); the parts handle the reserved requests, `stop` (a JobStop)
    the stop signal's.
    """

    def __init__(self, ctl: ControllerServices, sock, *, registry, rendezvous, collectives,
                 progress, stop=None):
        self._ctl = ctl
        self._job_stop = stop  # a platoon._centre.stopsignal.JobStop
        self._sock = sock
        self._registry = registry
        self._rendezvous = rendezvous
        self._collectives = collectives
        self._progress = progress
        self._rcvtimeo: Optional[int] = None  # the socket's receive timeout, in ms, while serving
        # A multi-node job's last worker of this node, told whether to evaluate once the
        # tie's final round has made the centres one (`answer_final`): (envelope, seq).
        self.awaiting_final: Optional[tuple] = None
        self.warnings = ThrottledLog(log)  # bad requests: a few lines, then a count
        self._reserved = {  # handler(envelope, request, record, request frame: its Peer-Address)
            protocol.REGISTER: self._register,
            protocol.INIT_PARAMS: self._init_params,
            protocol.PARAMS_READY: self._params_ready,
            protocol.BARRIER: self._barrier,
            protocol.BARRIER_CANCEL: self._acknowledge,
            protocol.DONE: self._done,
            protocol.REPORT: self._report,
            protocol.ALLREDUCE: self._all_reduce,
            protocol.ALLREDUCE_CANCEL: self._all_reduce_cancel,
            protocol.ALLREDUCE_SETUP: self._all_reduce_setup,
            protocol.INIT_STATE: self._init_state,
            protocol.STOP: self._stop,
            protocol.TRAINED: self._trained,
            protocol.FINAL_RESULT: self._final_result,
        }

    # -- replies --

    def reply(self, envelope: list, seq: Optional[int], result: Any) -> None:
        """Send `result` as the reply to request `seq`; TypeError or ValueError if it is not
        JSON-serialisable."""
        self._send(envelope, protocol.encode_reply(seq, result))

    def fail(self, envelope: list, seq: Optional[int], exc: BaseException) -> None:
        """Reply with error `exc`: the worker raises it."""
        self._send(envelope, protocol.encode_error(seq, type(exc).__name__, str(exc)))

    def _send(self, envelope, payload):
        sock = self._sock
        for part in envelope:
            sock.send(part, zmq.SNDMORE)
        sock.send(payload)

    # -- one request --

    def serve_next(self, until: float) -> None:
        """Handle the next request, waiting for it until monotonic time `until` at most."""
        # Block in recv with a receive timeout rather than in poll: a poll costs two
        # system calls and a Python Poller per request (about 10 us a round trip).
        wait_ms = max(0, int((until - time.monotonic()) * 1000))
        if self._rcvtimeo is None or not wait_ms - 50 <= self._rcvtimeo <= wait_ms:
            self._sock.rcvtimeo = self._rcvtimeo = wait_ms
        try:
            identity = self._sock.recv()  # a ROUTER's first frame: the peer (bytes: no Frame)
        except zmq.Again:
            return
        self.serve_one(identity)

    def stop_waiting(self) -> None:
        """Make the socket's receives block again (serving has stopped)."""
        self._sock.rcvtimeo = -1
        self._rcvtimeo = None

    def serve_one(self, identity: bytes) -> None:
        """Read the rest of the request from the peer `identity` (the message's first frame),
        handle it, reply."""
        sock = self._sock
        body = [sock.recv(copy=False)]  # a ROUTER gives at least one frame after the identity
        while body[-1].more:
            body.append(sock.recv(copy=False))
        envelope = [identity]
        if len(body) >= 2 and len(body[0]) == 0:  # a REQ client's empty delimiter
            envelope.append(b"")
            body = body[1:]
        if len(body) != 1:
            self.fail(envelope, None, ProtocolError(
                "expected one request frame, got %d; send a single JSON object" % len(body)))
            return
        payload = body[0].bytes  # (bytes: what the JSON decoder reads)
        try:
            request = protocol.decode_request(payload, self._ctl.max_request_bytes)
        except ProtocolError as exc:
            self.warnings.warning("malformed-request", "malformed request rejected: %s", exc)
            self.fail(envelope, protocol.peek_seq(payload), exc)
            return
        try:
            self._dispatch(envelope, request, body[0])  # (its Peer-Address too)
        except (PlatoonError, ValueError, TypeError) as exc:
            self.warnings.warning("rejected-request", "request %.80r rejected: %s",
                                  request.req, exc)
            self.fail(envelope, request.seq, exc)
        except Exception as exc:  # never let one request end the job
            log.exception("request %r failed in the controller", request.req)
            self.fail(envelope, request.seq, exc)

    def _dispatch(self, envelope, request, frame):
        record = self._registry.by_identity(envelope[0])
        if request.req != protocol.REGISTER:
            if record is None:
                raise NotRegistered("request %r comes from a connection that has not "
                                    "registered; create a platoon.Worker, which registers "
                                    "first" % (request.req,))
            if request.worker_id is not None and request.worker_id != record.worker_id:
                raise ProtocolError("request says worker_id %d but this connection registered "
                                    "as worker %d" % (request.worker_id, record.worker_id))
            if request.req != protocol.BARRIER:  # it gave up waiting at the barrier
                self._rendezvous.leave_barrier(record.worker_id)
        if not request.is_reserved:
            self._user_request(envelope, request, record)
            return
        handler = self._reserved.get(request.req)
        if handler is None:
            raise ProtocolError("unknown reserved request %r; names starting with %r belong to "
                                "platoon, pick another name" % (request.req,
                                                                protocol.RESERVED_PREFIX))
        handler(envelope, request, record, frame)

    def _user_request(self, envelope, request, record: WorkerRecord):
        wid = record.worker_id
        try:
            result = self._ctl.handle_control(request.req, wid, request.req_info)
        except Exception as exc:  # the worker gets it; the controller keeps serving
            log.exception("handle_control(%r) from worker %d raised", request.req, wid)
            self._send(envelope, protocol.encode_error(
                request.seq, type(exc).__name__, "handle_control(%r) raised %s: %s"
                % (request.req, type(exc).__name__, exc), traceback.format_exc()))
            return
        try:
            self.reply(envelope, request.seq, result)
        except (TypeError, ValueError) as exc:
            raise PlatoonError("handle_control(%r) returned %r, which is not JSON-serialisable "
                               "(%s); return dicts, lists, strings, numbers, booleans or None"
                               % (request.req, type(result).__name__, exc)) from None

    # -- reserved requests --

    def _register(self, envelope, request, record, frame):
        """A worker's registration (or, with its token, its return after a reconnect)."""
        info = request.req_info if isinstance(request.req_info, dict) else {}
        ctl = self._ctl
        payload = []

        def welcome(record, new):  # all that can fail, before the worker is recorded
            reply = {"worker_id": record.worker_id,
                     "is_first": self._rendezvous.is_first(record.worker_id, new),
                     "job_id": ctl.job_id, "num_workers": ctl.num_workers,
                     "controller_pid": os.getpid(), "controller_host": HOSTNAME,
                     "token": record.token, "max_request_bytes": ctl.max_request_bytes}
            if ctl.node_link is not None:
                reply.update(ctl.node_link.topology(record.worker_id))
            if self._job_stop is not None:
                reply["stop_segment"] = self._job_stop.open(ctl.reserve_shared)
            payload.append(protocol.encode_reply(request.seq, reply))

        record, new = self._registry.register(envelope[0], info, frame,
                                              ctl.transport, ctl.control_port, welcome)
        if new:
            self._rendezvous.worker_registered(record.worker_id)
        self._send(envelope, payload[0])

    def _init_params(self, envelope, request, record, _):
        info = request.req_info if isinstance(request.req_info, dict) else {}
        layout = protocol.validate_layout(info.get("layout"))
        names = info.get("names")
        if names is not None:
            try:
                names = protocol.check_names(names, len(layout))
            except (TypeError, ValueError) as exc:
                raise ProtocolError(str(exc)) from None
        self._rendezvous.init_params(envelope, request.seq, record, layout, names)

    def _params_ready(self, envelope, request, record, _):
        self._rendezvous.params_ready(envelope, request.seq, record)

    def _barrier(self, envelope, request, record, _):
        self._rendezvous.barrier(envelope, request.seq, record.worker_id)

    def _acknowledge(self, envelope, request, record, _):
        self.reply(envelope, request.seq, None)  # (what it cancels is done in _dispatch)

    def _done(self, envelope, request, record, _):
        info = request.req_info if isinstance(request.req_info, dict) else {}
        self.reply(envelope, request.seq, None)
        if info.get("error") and not record.has_left:
            self._registry.fail(record, {"pid": record.pid, "error": str(info["error"])})
        else:
            self._registry.done(record)

    def _report(self, envelope, request, record, _):
        self._progress.report(record.worker_id, request.req_info)
        self.reply(envelope, request.seq, None)

    def _trained(self, envelope, request, record, _):
        """``platoon-trained``: the worker made its last sync; the reply tells the last of the
        job's workers to do so to evaluate the final centre. On several nodes with tied
        centres, the last of this node's workers is answered once the tie's final round has
        made the centres one (`answer_final`), and only node 0's evaluates it."""
        evaluate = self._progress.trained(record.worker_id, self._registry)
        link = self._ctl.node_link
        if evaluate and link is not None and link.trained():
            self.awaiting_final = (envelope, request.seq)
            return
        self.reply(envelope, request.seq, {"evaluate": evaluate})

    def answer_final(self) -> None:
        """Answer the worker waiting for the agreed centre (`_trained`) once it is there."""
        link = self._ctl.node_link
        if self.awaiting_final is None or link is None:  # (awaited only with a link)
            return
        evaluate = link.final_centre()
        if evaluate is None:
            return
        envelope, seq = self.awaiting_final
        self.awaiting_final = None
        self.reply(envelope, seq, {"evaluate": evaluate})

    def _final_result(self, envelope, request, record, _):
        """``platoon-final-result`` {metrics}: the final centre's evaluation (the first kept)."""
        info = request.req_info if isinstance(request.req_info, dict) else {}
        stored = self._progress.final(record.worker_id, info.get("metrics"))
        link = self._ctl.node_link
        if stored and link is not None:  # platoon.mpi says it (node 0: the agreed centre's)
            link.final_result = self._progress.final_result
        self.reply(envelope, request.seq, {"stored": stored})

    def _all_reduce(self, envelope, request, record, _):
        self._collectives.join(envelope, request.seq, record.worker_id, request.req_info)

    def _all_reduce_cancel(self, envelope, request, record, _):
        self._collectives.cancel(record.worker_id, request.req_info)
        self.reply(envelope, request.seq, None)

    def _all_reduce_setup(self, envelope, request, record, _):
        self.reply(envelope, request.seq,
                   self._collectives.setup(record.worker_id, request.req_info))

    def _init_state(self, envelope, request, record, _):
        self.reply(envelope, request.seq, self._collectives.state(request.req_info))

    def _stop(self, envelope, request, record, _):
        """``platoon-stop`` {request, reason}: ask for the job to stop, or just read whether it
        must; the reply is {stop, by, reason}."""
        info = request.req_info if isinstance(request.req_info, dict) else {}
        reason = info.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise ProtocolError("platoon-stop: reason must be a string or null, got %s"
                                % type(reason).__name__)
        job_stop = self._job_stop
        if job_stop is None:
            raise PlatoonError("this controller has no stop signal")
        if info.get("request"):
            job_stop.request(record.worker_id, reason)
        self.reply(envelope, request.seq, job_stop.state())
