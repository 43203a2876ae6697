"""The live twins' process runtime: a child process beside the service or the gateway, fed over a socket pair."""
