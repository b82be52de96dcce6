"""The seed papers' model zoo, from torchvision and timm, randomly initialised.

Inception-v3 and GoogLeNet are built without their auxiliary classifier heads: the short test
measures the main network (as tf_cnn_benchmarks' synthetic runs do); the heads add <5% FLOPs.
"""

from __future__ import annotations

from dlscale.workloads.base import ImageClassifier, register


def _tv(fn_name: str, **kw):
    def build(num_classes: int):
        import torchvision.models as tvm

        return getattr(tvm, fn_name)(weights=None, num_classes=num_classes, **kw)

    return build


def _timm(model_name: str):
    def build(num_classes: int):
        import timm

        return timm.create_model(model_name, pretrained=False, num_classes=num_classes)

    return build


register(ImageClassifier("resnet50", _tv("resnet50"), "torchvision", 224, 32,
                  "ResNet-50 v1.5 (stride on the 3x3 conv), 25.6M parameters"))
register(ImageClassifier("resnet18", _tv("resnet18"), "torchvision", 224, 32, "ResNet-18, 11.7M parameters"))
register(ImageClassifier("vgg16", _tv("vgg16"), "torchvision", 224, 32, "VGG-16 (no batch norm), 138M parameters"))
register(ImageClassifier("vgg19", _tv("vgg19"), "torchvision", 224, 32, "VGG-19 (no batch norm), 144M parameters"))
register(ImageClassifier("alexnet", _tv("alexnet"), "torchvision", 224, 63,
                  "AlexNet (torchvision's one-GPU variant), 61M parameters"))
register(ImageClassifier("googlenet", _tv("googlenet", aux_logits=False, init_weights=True), "torchvision", 224, 32,
                  "GoogLeNet (Inception-v1), no auxiliary heads, 6.6M parameters"))
register(ImageClassifier("inception_v3", _tv("inception_v3", aux_logits=False, init_weights=True), "torchvision", 299, 75,
                  "Inception-v3, no auxiliary head, 23.8M parameters"))
register(ImageClassifier("inception_v4", _timm("inception_v4"), "timm", 299, 75, "Inception-v4 (timm), 42.7M parameters"))
