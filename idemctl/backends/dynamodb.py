"""``dynamodb://TABLE``; Powertools' layout too."""

from idemctl.backends.registry import Backend, register

register(
    Backend(
        "dynamodb",
        ("dynamodb",),
        store="idemctl.stores.dynamodb:DynamoDBStore",
        driver="boto",
        extra="dynamodb",
        credentials_fix="check the AWS credentials (environment, profile or role) and the region",
        layouts={"powertools": "idemctl.powertools.dynamodb:DynamoDBPowertoolsTable"},
        scratch="idemctl.harness.rooms:DynamoDBRoom",
    )
)
