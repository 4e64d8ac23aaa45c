from pipeline.apps.cli import app

app(prog_name="pexec")
