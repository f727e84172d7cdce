from deerflow_web.web import create_app

app = create_app()
