"""Entry point: `python app.py [--help]` launches the real-time transcription web app."""

from realtime.web.server import main

if __name__ == "__main__":
    main()
