"""Object detection: torchvision's detectors and detector_tiny (workload.py), the made shapes dataset in COCO's
layout, the layout's reader and COCO mAP (coco.py), and the long test to an mAP target (task.py)."""
