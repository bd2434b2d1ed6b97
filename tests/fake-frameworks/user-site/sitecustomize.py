# A user's own sitecustomize: gpucollect's sitecustomize must still run it.
import os

USER_SITECUSTOMIZE_RAN = True
os.environ["GPUCOLLECT_TEST_USER_SITECUSTOMIZE"] = "ran"
