"""dynemb's logger (mxRec: ``mx_rec.util.log.logger``)."""
import logging
import os

logger = logging.getLogger("dynemb")
if not logger.handlers:
    _h = logging.StreamHandler()
    _h.setFormatter(logging.Formatter("[dynemb %(levelname)s] %(message)s"))
    logger.addHandler(_h)
    # mxRec's scripts set MXREC_LOG_LEVEL; DYNEMB_LOG_LEVEL wins when both are set
    logger.setLevel(os.environ.get("DYNEMB_LOG_LEVEL",
                                   os.environ.get("MXREC_LOG_LEVEL", "INFO")).upper())
    logger.propagate = False
