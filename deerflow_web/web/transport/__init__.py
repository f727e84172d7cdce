"""How bytes arrive: the gevent worker, the request body, the multipart stream, the upload entry."""
