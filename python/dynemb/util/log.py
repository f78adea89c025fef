"""dynemb's logger (mxRec: ``mx_rec.util.log.logger``)."""
import logging
import os

logger = logging.getLogger("dynemb")
if not logger.handlers:
    _h = logging.StreamHandler()
    _h.setFormatter(logging.Formatter("[dynemb %(levelname)s] %(message)s"))
    logger.addHandler(_h)
    logger.setLevel(os.environ.get("DYNEMB_LOG_LEVEL", "INFO").upper())
    logger.propagate = False
