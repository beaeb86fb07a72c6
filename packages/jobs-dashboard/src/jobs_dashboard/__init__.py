"""jobs-dashboard: the operator web UI for jobs.

:func:`dashboard_app` answers an ASGI app (Starlette, Jinja2 templates, a little vanilla JS, every
asset shipped in the package) to mount in FastAPI, Starlette or Django's ASGI application, or to
serve alone with ``jobsctl dashboard``. It reads and acts only through
:mod:`jobs_core.introspect`, so it works on any driver carrying the capabilities a page needs.
"""

from jobs_dashboard._app import PAGE_CAPABILITIES, dashboard_app
from jobs_dashboard._security import AuthHook, BasicAuth, basic_auth

__version__ = "0.1.0"

__all__ = ["PAGE_CAPABILITIES", "AuthHook", "BasicAuth", "basic_auth", "dashboard_app"]
