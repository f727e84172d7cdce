"""The Flask application: factory, extensions, blueprints and error handlers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flask import Flask
from werkzeug.middleware.proxy_fix import ProxyFix

from deerflow_web.errors import ConfigError
from deerflow_web.settings import load_settings
from deerflow_web.web.json_provider import AppRequest
from deerflow_web.web.json_provider import OrjsonProvider

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # templates/ and static/ live at the root


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    """Create and configure the web application.

    `test_config` may name `BASE_DIR` and `CONFIG_PATH` (else DEER_FLOW_HOME and
    DEER_FLOW_CONFIG_PATH apply) and any Flask setting.

    Started for real, with no `test_config` (`app.py` under gunicorn, or Flask's CLI
    finding this factory through `--app deerflow_web.web`), a configuration that cannot
    work stops the process with one line, not a traceback; gunicorn's worker turns it
    into "App failed to load" (web/transport/server.py).

    Raises:
        ConfigError: The configuration cannot work (with a `test_config`).
    """
    if test_config is not None:
        return _create_app(test_config)
    try:
        return _create_app({})
    except ConfigError as error:
        raise SystemExit(f"deerflow-web cannot start: {error}") from None


def _create_app(test_config: Mapping[str, Any]) -> Flask:
    from deerflow_web.web import cli
    from deerflow_web.web import helpers
    from deerflow_web.web import i18n
    from deerflow_web.web import thread_access
    from deerflow_web.web import wiring
    from deerflow_web.web.accounts import gate as auth
    from deerflow_web.web.accounts import usage
    from deerflow_web.web.errors import register_error_handlers
    from deerflow_web.web.extensions import csrf
    from deerflow_web.web.marks import PROBE
    from deerflow_web.web.marks import request_has
    from deerflow_web.web.security import add_security_headers
    from deerflow_web.web.security import check_api_origin
    from deerflow_web.web.security import refuse_unknown_host

    overrides = dict(test_config)
    settings = load_settings(overrides.get("BASE_DIR"), config_path=overrides.get("CONFIG_PATH"))
    app = Flask(
        __name__,
        template_folder=str(PROJECT_ROOT / "templates"),
        static_folder=str(PROJECT_ROOT / "static"),
    )
    app.json = OrjsonProvider(app)
    # `//` in a URL matches nothing rather than redirecting: an empty id or name is a 404,
    # as on DeerFlow's gateway, and never a 308 to some other route.
    app.url_map.merge_slashes = False
    app.request_class = AppRequest
    app.config.update(
        SECRET_KEY=settings.secret_key or wiring.secret_key_of_data_dir(settings),
        MAX_FORM_MEMORY_SIZE=64 * 1024,
        # A backstop only: the upload service enforces the real limits while streaming.
        MAX_CONTENT_LENGTH=settings.limits.max_total_size + 16 * 1024 * 1024,
        DEERFLOW_SETTINGS=settings,  # for the gunicorn worker (web/transport/server.py)
    )
    app.config.update(overrides)
    # First of all hooks: no route, form check or page runs for a host we do not serve.

    def check_host() -> None:
        # Health probes come by the instance's address and read nothing: never refused.
        if not request_has(PROBE):
            refuse_unknown_host(settings.allowed_hosts)

    app.before_request(check_host)

    csrf.init_app(app)
    i18n.init_app(app, PROJECT_ROOT / "translations")
    wiring.init_app(app, settings)
    helpers.register(app)
    app.add_template_global(auth.signed_in, "auth_user")
    usage.init_app(app)
    if settings.trusted_proxies:
        # Behind a load balancer: the client's address (lockouts), scheme (Secure cookies),
        # host and port (the same-origin check of security.py) come from X-Forwarded-*,
        # set by as many proxies as are trusted; in both modes.
        app.wsgi_app = ProxyFix(  # type: ignore[method-assign]
            app.wsgi_app,
            x_for=settings.trusted_proxies,
            x_proto=settings.trusted_proxies,
            x_host=settings.trusted_proxies,
            x_port=settings.trusted_proxies,
        )
    if settings.auth.enabled:
        auth.init_app(app)
    app.before_request(check_api_origin)  # after the sign-in gate, as a view's own check
    thread_access.init_app(app)  # after both: it needs the user
    cli.init_app(app)

    from deerflow_web.web.api import docs as api_docs
    from deerflow_web.web.api import health
    from deerflow_web.web.api import history as history_api
    from deerflow_web.web.api import threads as threads_api
    from deerflow_web.web.api import tus
    from deerflow_web.web.api import uploads as api
    from deerflow_web.web.chat import preview as chat
    from deerflow_web.web.files import downloads
    from deerflow_web.web.files import history as history_pages
    from deerflow_web.web.files import pages
    from deerflow_web.web.files import share

    csrf.exempt(api.bp)  # the API resists cross-site requests by origin instead (security.py)
    csrf.exempt(tus.bp)  # nested in the API; Flask-WTF looks each blueprint up by itself
    csrf.exempt(threads_api.bp)  # nested in the API too
    csrf.exempt(history_api.bp)  # nested in the API too
    app.register_blueprint(api.bp)
    app.register_blueprint(pages.bp)
    app.register_blueprint(downloads.bp)
    app.register_blueprint(history_pages.bp)
    app.register_blueprint(share.bp)
    app.register_blueprint(chat.bp)
    if settings.auth.enabled:
        from deerflow_web.web.accounts import api as auth_api
        from deerflow_web.web.accounts import pages as account_pages

        # Cookie requests carry X-CSRF-Token instead (web/accounts/gate.py).
        csrf.exempt(auth_api.bp)
        csrf.exempt(auth_api.admin_bp)
        app.register_blueprint(auth_api.bp)
        app.register_blueprint(auth_api.admin_bp)
        app.register_blueprint(account_pages.bp)
    else:
        from deerflow_web.web.accounts.api import single_user_bp

        app.register_blueprint(single_user_bp)  # DeerFlow's UI asks these on every page
    app.register_blueprint(api_docs.bp)
    app.register_blueprint(health.bp)
    app.after_request(add_security_headers)
    register_error_handlers(app)
    return app
