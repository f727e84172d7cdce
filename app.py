from deerflow_web.web import create_app
from deerflow_web.web.wiring import EXTENSION_KEY

# A configuration that cannot work stops the process here with one line (`create_app`).
app = create_app()
# A server instance keeps its conversion leases alive and takes over the jobs of an
# instance that died (SPEC 9), even before it converts anything itself; with
# `jobs.run_in_web` off it runs no jobs and this does nothing (workers run them). Not
# before start-up has migrated the database, which may still be out of reach.
services = app.extensions[EXTENSION_KEY]
services.startup.then(services.conversions.start_keeper)
