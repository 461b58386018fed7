"""The errors a circuit reports to the host."""

KINDS = ("bad-input", "incompatible-snapshot", "protocol", "failed")


class CircuitError(Exception):
    """An error the host sees as the WIT ``circuit-error`` of ``kind``:
    ``bad-input`` (an event the circuit cannot read), ``incompatible-snapshot``,
    ``protocol`` (calls out of order) or ``failed`` (anything else)."""

    def __init__(self, kind: str, message: str):
        if kind not in KINDS:
            raise ValueError(f"unknown circuit error kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
