"""An app that registers two different functions under one workflow name."""

from worker import workflow


@workflow("broken.order")
def order(ctx, input):
    return 1


@workflow("broken.order")
def order_v2(ctx, input):
    return 2
