"""Uploads: the rules (limits, naming, conflicts), the commit of a request's files and
their records, the optional conversion that follows, the gateway response shape, bulk
delete. `service.UploadService` is where an upload is committed."""
