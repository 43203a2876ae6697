"""The prediction and routing service (``balanceroute serve``) and the router's HTTP client."""
