"""What a worker takes from outside its manifest, checked or provided by whoever starts it as well: the data
plane's keys (`keys`, from its environment), its sources' rate files (`rate_files`) and the user classes the
manifest names (`user_code`). Below both the runtime (which reads them) and the control plane and CLI (which
generate the keys and check the rest before a worker starts), so neither reaches into the other.
"""
