"""What travels inside the registered model: the image code and the pyfunc that uses it.

The lowest room: it imports nothing else of hvdflow, because ``classifier`` and ``images`` are
pickled by value into every registered model and must load where hvdflow is not installed.
"""

# The MLmodel metadata key under which an ImageClassifier describes itself (input shape, labels):
# here, so that reading it (hvdflow score's driver) does not import MLflow's pyfunc.
METADATA_KEY = "hvdflow"
