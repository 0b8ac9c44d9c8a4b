"""``doctor``'s policy as a library call (``idemctl.operate.doctor``, kept here for the
import path the docs have always shown)::

    from idemctl.doctor import diagnose

    report = diagnose("postgresql://app@db/orders", source="the deploy script")
"""

from idemctl.operate.doctor import NOT_PROVISIONED, Diagnosis, DoctorReport, diagnose

__all__ = ["NOT_PROVISIONED", "Diagnosis", "DoctorReport", "diagnose"]
