"""What travels inside the registered model: the image code and the pyfunc that uses it.

The lowest room: it imports nothing else of hvdflow, because ``classifier`` and ``images`` are
pickled by value into every registered model and must load where hvdflow is not installed.
"""
